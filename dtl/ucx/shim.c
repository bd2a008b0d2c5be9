//go:build ucx

// See shim.h. The callbacks here only hand UCX's arguments to Go
// (callbacks.go) and give UCX back its requests; Go decides everything.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "shim.h"
#include "_cgo_export.h"

// ucp_am_recv_data_nbx, ucp_conn_request_query and memory handles in
// request parameters are what this needs of UCX's API.
#if UCP_API_VERSION < UCP_VERSION(1, 13)
#error "dyadfs's UCX transport needs UCX 1.13 or newer"
#endif

// The one active message id dyadfs uses; the message type is in the header.
#define SHIM_AM_ID 1

ucs_status_t shim_init(ucp_config_t *config, ucp_context_h *context)
{
    ucp_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features   = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.name       = "dyadfs";
    return ucp_init(&params, config, context);
}

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length,
                          void *data, size_t length,
                          const ucp_am_recv_param_t *param)
{
    ucp_ep_h reply_ep = NULL;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
        reply_ep = param->reply_ep;
    }
    return goAmRecv((uintptr_t)arg, (void *)header, header_length, data,
                    length, param->recv_attr, reply_ep);
}

// shim_worker_create makes the worker in UCS_THREAD_MODE_SERIALIZED: one
// goroutine drives it, but that goroutine is not locked to an OS thread
// (see worker.go), so successive calls may come from different threads,
// never two at once. *thread_mode is the mode UCX granted.
ucs_status_t shim_worker_create(ucp_context_h context, uintptr_t handle,
                                ucp_worker_h *worker, size_t *max_am_header,
                                int *thread_mode)
{
    ucp_worker_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucs_status_t status = ucp_worker_create(context, &params, worker);
    if (status != UCS_OK) {
        return status;
    }

    ucp_worker_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER |
                      UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    status = ucp_worker_query(*worker, &attr);
    if (status == UCS_OK) {
        *max_am_header = attr.max_am_header;
        *thread_mode   = attr.thread_mode;
        ucp_am_handler_param_t am;
        memset(&am, 0, sizeof(am));
        am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                        UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG;
        am.id  = SHIM_AM_ID;
        am.cb  = am_cb;
        am.arg = (void *)handle;
        status = ucp_worker_set_am_recv_handler(*worker, &am);
    }
    if (status != UCS_OK) {
        ucp_worker_destroy(*worker);
        *worker = NULL;
    }
    return status;
}

// shim_mem_map maps length bytes of private anonymous memory and registers
// them with UCX (for RDMA and CMA zero-copy); shim_mem_unmap undoes both.
// Plain mmap rather than UCP_MEM_MAP_ALLOCATE, whose first choice is a
// System V shared memory segment.
ucs_status_t shim_mem_map(ucp_context_h context, size_t length,
                          ucp_mem_h *memh, void **address)
{
    void *addr = mmap(NULL, length, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (addr == MAP_FAILED) {
        return UCS_ERR_NO_MEMORY;
    }
    ucp_mem_map_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                        UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address    = addr;
    params.length     = length;
    ucs_status_t status = ucp_mem_map(context, &params, memh);
    if (status != UCS_OK) {
        munmap(addr, length);
        return status;
    }
    *address = addr;
    return UCS_OK;
}

void shim_mem_unmap(ucp_context_h context, ucp_mem_h memh, void *address,
                    size_t length)
{
    ucp_mem_unmap(context, memh);
    munmap(address, length);
}

// sockaddr_of fills ss with ip (IPv4 or IPv6 text) and port.
static int sockaddr_of(const char *ip, uint16_t port,
                       struct sockaddr_storage *ss, socklen_t *len)
{
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, ip, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port   = htons(port);
        *len            = sizeof(*in4);
        return 0;
    }
    if (inet_pton(AF_INET6, ip, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port   = htons(port);
        *len             = sizeof(*in6);
        return 0;
    }
    return -1;
}

static uint16_t port_of(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET6) {
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    }
    return ntohs(((const struct sockaddr_in *)ss)->sin_port);
}

static void conn_cb(ucp_conn_request_h request, void *arg)
{
    goConnRequest((uintptr_t)arg, request);
}

ucs_status_t shim_listen(ucp_worker_h worker, const char *ip, uint16_t port,
                         uintptr_t handle, ucp_listener_h *listener,
                         uint16_t *bound_port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (sockaddr_of(ip, port, &ss, &len) != 0) {
        return UCS_ERR_INVALID_ADDR;
    }
    ucp_listener_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask       = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                              UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr    = (const struct sockaddr *)&ss;
    params.sockaddr.addrlen = len;
    params.conn_handler.cb  = conn_cb;
    params.conn_handler.arg = (void *)handle;
    ucs_status_t status = ucp_listener_create(worker, &params, listener);
    if (status != UCS_OK) {
        return status;
    }
    ucp_listener_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    status = ucp_listener_query(*listener, &attr);
    if (status != UCS_OK) {
        ucp_listener_destroy(*listener);
        *listener = NULL;
        return status;
    }
    *bound_port = port_of(&attr.sockaddr);
    return UCS_OK;
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    goEpError((uintptr_t)arg, status);
}

// Every endpoint reports peer failures (UCP_ERR_HANDLING_MODE_PEER): its
// requests then complete with an error instead of aborting the process.
static void ep_params_common(ucp_ep_params_t *params, uintptr_t handle)
{
    params->field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params->err_mode       = UCP_ERR_HANDLING_MODE_PEER;
    params->err_handler.cb = ep_err_cb;
    params->err_handler.arg = (void *)handle;
}

ucs_status_t shim_connect(ucp_worker_h worker, const char *ip, uint16_t port,
                          uintptr_t handle, ucp_ep_h *ep)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (sockaddr_of(ip, port, &ss, &len) != 0) {
        return UCS_ERR_INVALID_ADDR;
    }
    ucp_ep_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask       = UCP_EP_PARAM_FIELD_FLAGS |
                              UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags            = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr    = (const struct sockaddr *)&ss;
    params.sockaddr.addrlen = len;
    ep_params_common(&params, handle);
    return ucp_ep_create(worker, &params, ep);
}

// shim_ep_info describes an endpoint's configuration, its lanes included,
// in malloc'd text (for tests and debugging), or NULL.
char *shim_ep_info(ucp_ep_h ep)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL) {
        return NULL;
    }
    ucp_ep_print_info(ep, f);
    fclose(f);
    return buf;
}

ucs_status_t shim_accept(ucp_worker_h worker, ucp_conn_request_h request,
                         uintptr_t handle, ucp_ep_h *ep)
{
    ucp_ep_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask   = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    ep_params_common(&params, handle);
    return ucp_ep_create(worker, &params, ep);
}

int shim_conn_request_peer(ucp_conn_request_h request, char *buf, size_t len)
{
    ucp_conn_request_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) != UCS_OK) {
        return -1;
    }
    char ip[INET6_ADDRSTRLEN];
    const void *src;
    if (attr.client_address.ss_family == AF_INET6) {
        src = &((struct sockaddr_in6 *)&attr.client_address)->sin6_addr;
    } else {
        src = &((struct sockaddr_in *)&attr.client_address)->sin_addr;
    }
    if (inet_ntop(attr.client_address.ss_family, src, ip, sizeof(ip)) == NULL) {
        return -1;
    }
    int n = snprintf(buf, len,
                     attr.client_address.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u",
                     ip, (unsigned)port_of(&attr.client_address));
    return (n < 0 || (size_t)n >= len) ? -1 : n;
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    goSendDone((uintptr_t)user_data, status);
    ucp_request_free(request);
}

static void recv_cb(void *request, ucs_status_t status, size_t length,
                    void *user_data)
{
    goRecvDone((uintptr_t)user_data, status, length);
    ucp_request_free(request);
}

// started turns the status pointer of a non-blocking call into a status:
// UCS_INPROGRESS means the callback will come.
static ucs_status_t started(ucs_status_ptr_t p)
{
    if (p == NULL) {
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(p)) {
        return UCS_PTR_STATUS(p);
    }
    return UCS_INPROGRESS;
}

ucs_status_t shim_ep_close(ucp_ep_h ep, int force, uintptr_t handle)
{
    ucp_request_param_t param;
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS;
    param.flags        = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    param.cb.send      = send_cb;
    param.user_data    = (void *)handle;
    return started(ucp_ep_close_nbx(ep, &param));
}

ucs_status_t shim_am_send(ucp_ep_h ep, const void *header,
                          size_t header_length, const void *buffer,
                          size_t length, uint32_t flags, ucp_mem_h memh,
                          uintptr_t handle)
{
    ucp_request_param_t param;
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS;
    param.flags        = flags;
    param.cb.send      = send_cb;
    param.user_data    = (void *)handle;
    if (memh != NULL) {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        param.memh          = memh;
    }
    return started(ucp_am_send_nbx(ep, SHIM_AM_ID, header, header_length,
                                   buffer, length, &param));
}

ucs_status_t shim_am_recv(ucp_worker_h worker, void *desc, void *buffer,
                          size_t length, ucp_mem_h memh, uintptr_t handle)
{
    ucp_request_param_t param;
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.recv_am   = recv_cb;
    param.user_data    = (void *)handle;
    if (memh != NULL) {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        param.memh          = memh;
    }
    return started(ucp_am_recv_data_nbx(worker, desc, buffer, length, &param));
}
