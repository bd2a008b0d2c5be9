// Package ucx is dyadfs's UCX data transport (--dtl ucx): DYAD's UCX
// backend done again over libucp, so that the same binary moves files over
// RDMA on InfiniBand or RoCE and over TCP elsewhere. UCX picks the wires;
// its own environment (UCX_TLS, UCX_NET_DEVICES, UCX_RNDV_THRESH, ...)
// passes through untouched. The one default changed, unless the
// environment sets it, is UCX_CM_REUSEADDR=y, so that a restarted daemon
// listens on its address again at once. Besides files it carries daemons'
// small messages (dtl.Messenger).
//
// It is built only with the ucx build tag and UCX 1.13 or newer (Debian's
// libucx-dev, pkg-config ucx): go build -tags ucx. Without the tag, New
// says so.
//
// # Addresses
//
// Serve opens a UCP listener on the TCP host:port of Config.Listen, so Addr
// is a "host:port" as the TCP transport's is; a consumer connects to it
// with ucp_ep_create by sockaddr. UCX then wires the two workers with the
// best transports both ends share.
//
// # Threads
//
// One goroutine owns the UCP context, worker, listener, endpoints and
// registered buffers, and is the only one to call libucp (worker.go); the
// worker is UCS_THREAD_MODE_SERIALIZED, since the goroutine is not locked
// to a thread (a locked goroutine made every hand-over a switch of OS
// threads, and a round trip three times slower). It progresses the worker
// while there is work and otherwise arms it (ucp_worker_arm) and parks on
// its channel of commands, while a second goroutine waits in Go's netpoller
// for the worker's event fd and tells it. Everything else (Fetch and
// Message callers, the goroutines that read served files, message
// handlers) talks to it through the commands. UCX's callbacks reach Go
// through runtime/cgo.Handle (callbacks.go) and only queue work for the
// worker's loop.
//
// # Protocol
//
// Every message is one active message whose header says what it is
// (protocol.go). Peers first authenticate each other with the job secret
// (auth.go: dtl/peerauth's mutual HMAC challenge, under labels of its
// own). A consumer then sends requests, any number at once on one
// endpoint, each with an id; the owner answers each with either a refusal,
// or a small file whole in one message with its description, or the
// description followed by the file's data extents in chunks (holes are
// never sent) and an end message once the file is found unchanged.
//
// Chunks travel as rendezvous active messages: the owner reads a chunk
// into a registered buffer of its send pool and sends it with
// UCP_AM_SEND_FLAG_RNDV; the consumer's handler keeps the descriptor and
// pulls the data with ucp_am_recv_data_nbx straight into a registered
// buffer of its receive pool, which a goroutine writes to the file at the
// chunk's offset before the buffer returns to its ring. The sender's
// request completes only once the receiver has pulled the data, so the two
// pools and a per-transfer window are the whole flow control: a slow disk
// on either side slows the sender, nothing queues without bound. Why
// rendezvous active messages rather than eager ones, tagged messages or
// put with rkey exchange is in bench_test.go, with the numbers.
//
// # Shared memory
//
// Daemons of one host set UCX_TLS=sm,tcp (or cma,tcp): TCP connects them
// (UCX cannot connect by sockaddr over shared memory alone) and carries
// the small messages, and chunks move by CMA (process_vm_readv), one copy
// from the owner's buffer into the consumer's. UCX 1.13 gives an endpoint
// that handles peer failures a bulk lane only on a memory domain that can
// invalidate registrations, which CMA claims only when told to: the
// transport tells it (MEMORY_INVALIDATE, see ucxDefaults in worker.go,
// which says why that is sound here), unless UCX_CMA_MEMORY_INVALIDATE is
// set. posix and sysv shared memory report no peer failures (unless
// UCX_MM_ERROR_HANDLING=y) and stay out of such endpoints; measured, the
// messages they would carry were no faster here. CMA needs the daemons to
// be allowed to ptrace each other (the same user, or root, and
// kernel.yama.ptrace_scope 0); where they are not, set UCX_TLS=tcp.
//
// # Failures
//
// Endpoints are created with UCP_ERR_HANDLING_MODE_PEER and an error
// callback. A peer that dies or closes fails every operation in flight on
// its endpoint at once (each endpoint keeps a registry of them), and UCX
// completes the endpoint's outstanding requests with an error, which is
// when their buffers go back to their pools. Idle endpoints are closed.
//
// The completion-ownership rules (shared/seeds/rdma-endpoint-ownership.txt)
// hold as follows. Every operation has its own state and completion
// signal, never reused (I1). A pooled buffer returns to its ring only when
// the one UCX request that used it has completed and, on the receiving
// side, its data has been written out (I2). Callbacks find their Go object
// through a cgo.Handle deleted when the request's (or the endpoint's) last
// callback has fired (I3, I4). The active message handler stays registered
// for the worker's life, and a rendezvous descriptor of a live transfer
// that finds no free buffer waits, holding its sender back, until one is
// free; once held it is received even if its Fetch gives up meanwhile, so
// that its sender's request completes normally (I5).
package ucx
