// A fake libcuda: kiln's CUDA device runs over it on a machine without a GPU, so that its host-side launch path
// (argument packing, CUDA graphs, TinyJit replays) can be tested and profiled there. Every call succeeds, device
// memory is host memory (copies work), kernels do nothing. fake_launches() and friends count the calls.
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
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { return 0; }
CUresult cuEventCreate(void **e, unsigned f) { *e = malloc(8); return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, void *s) { return 0; }
CUresult cuEventSynchronize(void *e) { return 0; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = 0.001f; return 0; }
CUresult cuModuleLoadData(void **m, const void *img) { *m = malloc(8); return 0; }
CUresult cuModuleUnload(void *m) { free(m); return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { *f = malloc(8); return 0; }
CUresult cuFuncSetAttribute(void *f, int a, int v) { return 0; }
CUresult cuFuncGetAttribute(int *v, int a, void *f) { *v = 32; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sh, void *st, void **params, void **extra) { launches++; return 0; }
CUresult cuGraphCreate(void **g, unsigned f) { *g = malloc(8); return 0; }
CUresult cuGraphAddKernelNode_v2(void **n, void *g, void **deps, size_t nd, void *p) { *n = malloc(8); return 0; }
CUresult cuGraphAddDependencies_v2(void *g, void **from, void **to, void *data, size_t n) { edges += n; return 0; }
CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long f) { *e = malloc(8); return 0; }
CUresult cuGraphExecKernelNodeSetParams_v2(void *e, void *n, void *p) { setparams++; return 0; }
CUresult cuGraphLaunch(void *e, void *s) { graph_launches++; return 0; }
CUresult cuGraphExecDestroy(void *e) { free(e); return 0; }
CUresult cuGraphDestroy(void *g) { free(g); return 0; }
