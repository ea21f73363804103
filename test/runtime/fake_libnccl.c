// A fake libnccl for tests (test/runtime/test_nccl_allreduce.py): the calls kiln's binding makes (kiln/runtime/nccl.py).
// Its buffers are host memory (the fake libcuda's device memory, or CPU devices' arrays): at ncclGroupEnd the
// all-reduces queued in the group are one collective, its ranks' send buffers combined element by element and the
// result written to every rank's receive buffer (in place allowed). fake_nccl_calls(k): 0 ncclAllReduce calls,
// 1 groups run, 2 communicators made.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const void *send; void *recv; size_t count; int dtype, op; } Call;
static Call pending[64];
static int npending, depth;
static long calls[3];
long fake_nccl_calls(int kind) { return calls[kind]; }

int ncclGetVersion(int *v) { *v = 22703; return 0; }
const char *ncclGetErrorString(int r) { return "fake nccl error"; }
int ncclCommInitAll(void **comms, int n, const int *devices) {
  for (int i = 0; i < n; i++) { comms[i] = malloc(sizeof(int)); *(int *)comms[i] = devices[i]; }
  calls[2]++;
  return 0;
}
int ncclCommDestroy(void *comm) { free(comm); return 0; }

static double get(const void *p, int dtype, size_t k) {
  switch (dtype) {
    case 2: return ((const int32_t *)p)[k];
    case 4: return (double)((const int64_t *)p)[k];
    case 7: return ((const float *)p)[k];
    case 8: return ((const double *)p)[k];
  }
  return 0;
}
static void put(void *p, int dtype, size_t k, double v) {
  switch (dtype) {
    case 2: ((int32_t *)p)[k] = (int32_t)v; break;
    case 4: ((int64_t *)p)[k] = (int64_t)v; break;
    case 7: ((float *)p)[k] = (float)v; break;
    case 8: ((double *)p)[k] = v; break;
  }
}
static int run(void) {
  if (!npending) return 0;
  calls[1]++;
  size_t count = pending[0].count;
  int dtype = pending[0].dtype, op = pending[0].op;
  if (dtype != 2 && dtype != 4 && dtype != 7 && dtype != 8) return 5;   // ncclInvalidArgument
  double *acc = malloc(sizeof(double) * (count ? count : 1));
  for (size_t k = 0; k < count; k++) {
    double v = get(pending[0].send, dtype, k);
    for (int r = 1; r < npending; r++) {
      double x = get(pending[r].send, dtype, k);
      v = op == 0 ? v + x : op == 1 ? v * x : (x > v ? x : v);
    }
    acc[k] = v;
  }
  for (int r = 0; r < npending; r++) for (size_t k = 0; k < count; k++) put(pending[r].recv, dtype, k, acc[k]);
  free(acc);
  npending = 0;
  return 0;
}
int ncclGroupStart(void) { depth++; return 0; }
int ncclGroupEnd(void) { return --depth == 0 ? run() : 0; }
int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream) {
  calls[0]++;
  if (npending == 64) return 5;
  pending[npending++] = (Call){send, recv, count, dtype, op};
  return depth ? 0 : run();
}
