// A fake libcuda: kiln's CUDA device runs over it on a machine without a GPU, so that its host-side launch path
// (argument packing, CUDA graphs, TinyJit replays) can be tested and profiled there. Every call succeeds, device
// memory is host memory (copies work), kernels do nothing. fake_launches() and friends count the calls.
// fake_set_hang(1) makes the queued work never finish (cuStreamQuery/cuEventQuery answer CUDA_ERROR_NOT_READY), as
// a hung kernel's stream does; the last launch's dynamic shared memory, the kernel's attribute and the first bytes
// of its arguments are kept for the tests (fake_last_shared, fake_max_dynamic_shared, fake_capture).
// Built by test/runtime/test_cuda_launch_path.py: cc -O2 -shared -fPIC -o libcuda.so.1 fake_libcuda.c
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
typedef int CUresult;
static long launches = 0, graph_launches = 0, setparams = 0, edges = 0, registered = 0;
static long copies[4];   // host to device, device to host, device to device, peer (fake_copies(kind))
long fake_copies(int kind) { return copies[kind]; }
long fake_launches(void) { return launches; }
long fake_edges(void) { return edges; }
long fake_registered(void) { return registered; }
long fake_graph_launches(void) { return graph_launches; }
long fake_setparams(void) { return setparams; }
static int hang = 0, queries = 0;
static unsigned last_shared = 0;
static int max_dynamic_shared = 0;
static unsigned char param_bytes[4][128];
void fake_set_hang(int on) { hang = on; }
int fake_queries(void) { return queries; }
unsigned fake_last_shared(void) { return last_shared; }
int fake_max_dynamic_shared(void) { return max_dynamic_shared; }
// fake_capture(n, b): later launches keep the first b (<= 128) bytes of each of their first n (<= 4) arguments (the
// fake does not know how many a kernel takes); fake_param_bytes(i, b, out) copies argument i's out
static int capture_args = 0, capture_bytes = 0;
void fake_capture(int n, int nbytes) { capture_args = n; capture_bytes = nbytes; }
void fake_param_bytes(int i, int n, unsigned char *out) { memcpy(out, param_bytes[i], n); }
CUresult cuInit(unsigned f) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuGetErrorName(int c, const char **s) { *s = "FAKE"; return 0; }
CUresult cuGetErrorString(int c, const char **s) { *s = "fake"; return 0; }
// FAKE_CUDA_DEVICES=n pretends to have n GPUs (1 by default), each with a context of its own
CUresult cuDeviceGetCount(int *n) { const char *e = getenv("FAKE_CUDA_DEVICES"); *n = e ? atoi(e) : 1; return 0; }
CUresult cuDeviceGet(int *d, int i) { *d = i; return 0; }
CUresult cuDeviceGetName(char *s, int n, int d) { strncpy(s, "Fake H200", n); return 0; }
CUresult cuDeviceGetAttribute(int *v, int which, int d) {
  *v = which == 16 ? 132 : which == 75 ? 9 : which == 76 ? 0 : which == 97 ? 232448 : 1; return 0; }
CUresult cuDeviceTotalMem_v2(size_t *m, int d) { *m = (size_t)1 << 37; return 0; }
CUresult cuDeviceCanAccessPeer(int *a, int x, int y) { *a = 0; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void*)(uintptr_t)(0x1234 + 16 * d); return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
CUresult cuCtxSetCurrent(void *c) { return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuCtxEnablePeerAccess(void *c, unsigned f) { return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = *t = (size_t)1 << 37; return 0; }
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) { *p = (uint64_t)malloc(n); return 0; }
CUresult cuMemFree_v2(uint64_t p) { free((void*)p); return 0; }
CUresult cuMemsetD8_v2(uint64_t p, unsigned char b, size_t n) { memset((void*)p, b, n); return 0; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) { *p = malloc(n); return 0; }
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
// host memory used in place: the device address is the host address, as under unified addressing
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) { registered++; return 0; }
CUresult cuMemHostUnregister(void *p) { registered--; return 0; }
CUresult cuMemHostGetDevicePointer_v2(uint64_t *d, void *p, unsigned f) { *d = (uint64_t)p; return 0; }
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *s, size_t n) { copies[0]++; memcpy((void*)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n) { copies[1]++; memcpy(d, (void*)s, n); return 0; }
CUresult cuMemcpyDtoD_v2(uint64_t d, uint64_t s, size_t n) { copies[2]++; memcpy((void*)d, (void*)s, n); return 0; }
CUresult cuMemcpyHtoDAsync_v2(uint64_t d, const void *s, size_t n, void *st) { copies[0]++; memcpy((void*)d, s, n); return 0; }
CUresult cuMemcpyDtoHAsync_v2(void *d, uint64_t s, size_t n, void *st) { copies[1]++; memcpy(d, (void*)s, n); return 0; }
CUresult cuMemcpyDtoDAsync_v2(uint64_t d, uint64_t s, size_t n, void *st) { copies[2]++; memcpy((void*)d, (void*)s, n); return 0; }
CUresult cuMemcpyPeerAsync(uint64_t d, void *dc, uint64_t s, void *sc, size_t n, void *st) { copies[3]++; memcpy((void*)d, (void*)s, n); return 0; }
CUresult cuStreamCreate(void **s, unsigned f) { *s = malloc(8); return 0; }
CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
CUresult cuStreamSynchronize(void *s) { return 0; }
CUresult cuStreamQuery(void *s) { queries++; return hang ? 600 : 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { return 0; }
CUresult cuEventCreate(void **e, unsigned f) { *e = malloc(8); return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, void *s) { return 0; }
CUresult cuEventSynchronize(void *e) { return 0; }
CUresult cuEventQuery(void *e) { queries++; return hang ? 600 : 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = 0.001f; return 0; }
CUresult cuModuleLoadData(void **m, const void *img) { *m = malloc(8); return 0; }
CUresult cuModuleUnload(void *m) { free(m); return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { *f = malloc(8); return 0; }
CUresult cuFuncSetAttribute(void *f, int a, int v) { if (a == 8) max_dynamic_shared = v; return 0; }
CUresult cuFuncGetAttribute(int *v, int a, void *f) { *v = 32; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sh, void *st, void **params, void **extra) {
  launches++; last_shared = sh;
  for (int i = 0; i < capture_args && params; i++) memcpy(param_bytes[i], params[i], capture_bytes);
  return 0; }
// a tiled tensor map: the fake writes the address, rank, dims, box and swizzle into its 128 bytes (the real layout
// is the driver's own), so a test can see them reach a kernel's argument
CUresult cuTensorMapEncodeTiled(void *map, int dtype, unsigned rank, void *address, const uint64_t *dims,
                                const uint64_t *strides, const unsigned *box, const unsigned *elem, int interleave,
                                int swizzle, int l2, int oob) {
  if (((uintptr_t)map) % 64) return 1;
  uint64_t *words = (uint64_t*)map;
  memset(map, 0, 128);
  words[0] = (uint64_t)address; words[1] = rank; words[2] = (uint64_t)dtype; words[3] = (uint64_t)swizzle;
  for (unsigned i = 0; i < rank && i < 5; i++) { words[4 + i] = dims[i]; words[9 + i] = box[i]; }
  return 0; }
CUresult cuGraphCreate(void **g, unsigned f) { *g = malloc(8); return 0; }
CUresult cuGraphAddKernelNode_v2(void **n, void *g, void **deps, size_t nd, void *p) { *n = malloc(8); return 0; }
CUresult cuGraphAddDependencies_v2(void *g, void **from, void **to, void *data, size_t n) { edges += n; return 0; }
CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long f) { *e = malloc(8); return 0; }
CUresult cuGraphExecKernelNodeSetParams_v2(void *e, void *n, void *p) { setparams++; return 0; }
CUresult cuGraphLaunch(void *e, void *s) { graph_launches++; return 0; }
CUresult cuGraphExecDestroy(void *e) { free(e); return 0; }
CUresult cuGraphDestroy(void *g) { free(g); return 0; }
