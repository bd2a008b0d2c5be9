// The C side of the cgo fence: thin wrappers over libucp for what cgo
// cannot express (inline functions, macros, function pointers, unions,
// sockaddr building). Every wrapper that starts an operation reports
// UCS_OK when it finished in place (no callback will come), UCS_INPROGRESS
// when UCX will call back with handle, or the error that stopped it; no
// UCX request pointer reaches Go. handle is a runtime/cgo.Handle.

#ifndef DYADFS_UCX_SHIM_H
#define DYADFS_UCX_SHIM_H

#include <stdint.h>
#include <stdlib.h>
#include <ucp/api/ucp.h>

ucs_status_t shim_init(ucp_config_t *config, ucp_context_h *context);
ucs_status_t shim_worker_create(ucp_context_h context, uintptr_t handle,
                                ucp_worker_h *worker, size_t *max_am_header,
                                int *thread_mode);
ucs_status_t shim_mem_map(ucp_context_h context, size_t length,
                          ucp_mem_h *memh, void **address);
void shim_mem_unmap(ucp_context_h context, ucp_mem_h memh, void *address,
                    size_t length);
ucs_status_t shim_listen(ucp_worker_h worker, const char *ip, uint16_t port,
                         uintptr_t handle, ucp_listener_h *listener,
                         uint16_t *bound_port);
ucs_status_t shim_connect(ucp_worker_h worker, const char *ip, uint16_t port,
                          uintptr_t handle, ucp_ep_h *ep);
char *shim_ep_info(ucp_ep_h ep);
ucs_status_t shim_accept(ucp_worker_h worker, ucp_conn_request_h request,
                         uintptr_t handle, ucp_ep_h *ep);
int shim_conn_request_peer(ucp_conn_request_h request, char *buf, size_t len);
ucs_status_t shim_ep_close(ucp_ep_h ep, int force, uintptr_t handle);
ucs_status_t shim_am_send(ucp_ep_h ep, const void *header,
                          size_t header_length, const void *buffer,
                          size_t length, uint32_t flags, ucp_mem_h memh,
                          uintptr_t handle);
ucs_status_t shim_am_recv(ucp_worker_h worker, void *desc, void *buffer,
                          size_t length, ucp_mem_h memh, uintptr_t handle);

#endif
