/* A stand-in libcuda.so.1 for CPU tests of the launch path through the *real* driver bindings.
 *
 * Compiled at test time (tests/gpu/stubcuda.py: cc -shared -fPIC) and found by the binding's
 * dlopen("libcuda.so.1") through LD_LIBRARY_PATH in a test's subprocess. It implements the driver
 * entry points stitchtune calls (and those cuda-python / pycuda need to load), keeps a small model of
 * the driver's state and writes one JSON line per call to $STUB_CUDA_LOG with the decoded arguments.
 *
 * The model: "device memory" is host memory (256-byte aligned, so pointers are real and copies
 * work); a module image must be text "STUBCUBIN <kernel>:<nparams> ..." (else CUDA_ERROR_INVALID_IMAGE);
 * contexts are the primary context of each device (a per-thread stack: set / push / pop); streams are
 * any handle value; a stream can capture (cuStreamBeginCapture) and the calls a capture forbids
 * (allocation, module load, synchronous copies, synchronisation) then fail with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate it; the launches a capture records (not run
 * then) make the graph cuStreamEndCapture returns, cuGraphInstantiate copies it and cuGraphLaunch replays
 * them in order on its stream (each logged as a "graph_node"). A launch checks what a GPU checks: a
 * current context, a function of a loaded module, dynamic shared memory above 48 KiB only after the
 * opt-in, a cooperative grid within the co-resident limit, and (as the real kernels' 16-byte vector
 * loads do) every pointer argument 16-byte aligned: a misaligned one is a sticky
 * CUDA_ERROR_MISALIGNED_ADDRESS reported by the next synchronising call and every call after it.
 *
 * Environment:
 *   STUB_CUDA_LOG        file the JSON lines are appended to (none: no log)
 *   STUB_CUDA_DEVICES    number of GPUs (default 1)
 *   STUB_CUDA_SMS        SMs per GPU (default 132); STUB_CUDA_OCCUPANCY blocks per SM (default 2)
 *   STUB_CUDA_FAIL       "call=code[@n],..." the n-th call (default the first) of `call` returns `code`
 *                        (e.g. cuMemAlloc=2 out of memory, cuModuleLoadData=200)
 *   STUB_CUDA_FAULT      "code[@n]": the n-th launch faults asynchronously with `code` (e.g. 719
 *                        CUDA_ERROR_LAUNCH_FAILED): sticky, reported from the next synchronising call on
 *   STUB_CUDA_FAULT_MARK a file: fault only while it does not exist, and create it at the fault (so a
 *                        restarted process, e.g. the tuning worker, runs clean)
 *
 * Kernels do nothing, except one whose name starts with "copy": it copies its first argument's
 * allocation into its second's (so a program of copies computes something checkable).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t u64;

enum {
  OK = 0, E_INVALID_VALUE = 1, E_OUT_OF_MEMORY = 2, E_NOT_INITIALIZED = 3, E_NO_DEVICE = 100,
  E_INVALID_DEVICE = 101, E_INVALID_IMAGE = 200, E_INVALID_CONTEXT = 201, E_INVALID_HANDLE = 400,
  E_NOT_FOUND = 500, E_MISALIGNED = 716, E_LAUNCH_FAILED = 719, E_COOP_TOO_LARGE = 720,
  E_NOT_SUPPORTED = 801, E_CAPTURE_UNSUPPORTED = 900, E_CAPTURE_INVALIDATED = 901
};

static const struct { int code; const char *name; } ERRORS[] = {
  {0, "CUDA_SUCCESS"}, {1, "CUDA_ERROR_INVALID_VALUE"}, {2, "CUDA_ERROR_OUT_OF_MEMORY"},
  {3, "CUDA_ERROR_NOT_INITIALIZED"}, {100, "CUDA_ERROR_NO_DEVICE"}, {101, "CUDA_ERROR_INVALID_DEVICE"},
  {200, "CUDA_ERROR_INVALID_IMAGE"}, {201, "CUDA_ERROR_INVALID_CONTEXT"}, {400, "CUDA_ERROR_INVALID_HANDLE"},
  {500, "CUDA_ERROR_NOT_FOUND"}, {600, "CUDA_ERROR_NOT_READY"}, {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
  {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"}, {702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
  {716, "CUDA_ERROR_MISALIGNED_ADDRESS"}, {719, "CUDA_ERROR_LAUNCH_FAILED"},
  {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"}, {801, "CUDA_ERROR_NOT_SUPPORTED"},
  {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"}, {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
  {999, "CUDA_ERROR_UNKNOWN"},
};

#define MAX_DEV 8
#define MAX_STACK 16
#define SMEM_DEFAULT (48 * 1024)

typedef struct { int device; int magic; } Ctx;
typedef struct { char name[128]; int nparams; int max_dyn_smem; void *module; } Func;
typedef struct { int nfuncs; Func funcs[64]; } Module;
typedef struct { u64 base; size_t size; } Alloc;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialised = 0, ndev = 1, sms = 132, occupancy = 2;
static Ctx primary[MAX_DEV];
static int retained[MAX_DEV];
static Alloc allocs[4096];
static int nallocs = 0;
static int sticky = 0;                 /* an asynchronous fault: every call fails with it from the next sync */
static int pending = 0;                /* the fault, not yet reported by a synchronising call */
static u64 capturing = 0;              /* the stream capturing (0 = none; handle 0 cannot capture) */
static int capture_invalid = 0;
static int launches = 0;
static __thread Ctx *stack[MAX_STACK];
static __thread int depth = 0;

/* ------------------------------------------------------------------------------ logging */
static void logline(const char *fmt, ...) {
  const char *path = getenv("STUB_CUDA_LOG");
  if (!path || !*path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

static int cur_device(void) { return depth ? stack[depth - 1]->device : -1; }

/* a call's outcome, logged: {"call": name, "rc": rc, "ctx": device of the current context, <fields>} */
#define LOG(name, rc, fmt, ...) \
  logline("{\"call\": \"%s\", \"rc\": %d, \"ctx\": %d" fmt "}", name, rc, cur_device(), ##__VA_ARGS__)

/* STUB_CUDA_FAIL: the code the current call of `name` must fail with (0: none) */
static int injected(const char *name) {
  static int counts[256];
  static char names[256][64];
  static int n = 0;
  const char *spec = getenv("STUB_CUDA_FAIL");
  if (!spec || !*spec) return 0;
  int i;
  for (i = 0; i < n && strcmp(names[i], name); ++i) {}
  if (i == n && n < 256) { snprintf(names[n], sizeof names[n], "%s", name); counts[n++] = 0; }
  int count = ++counts[i];
  const char *p = spec;
  size_t len = strlen(name);
  while (p && *p) {
    if (!strncmp(p, name, len) && p[len] == '=') {
      int code = 0, at = 1;
      if (sscanf(p + len + 1, "%d@%d", &code, &at) >= 1 && count == at) return code;
    }
    p = strchr(p, ',');
    if (p) ++p;
  }
  return 0;
}

static void init_env(void) {
  const char *s;
  if ((s = getenv("STUB_CUDA_DEVICES"))) ndev = atoi(s);
  if ((s = getenv("STUB_CUDA_SMS"))) sms = atoi(s);
  if ((s = getenv("STUB_CUDA_OCCUPANCY"))) occupancy = atoi(s);
  if (ndev > MAX_DEV) ndev = MAX_DEV;
  for (int i = 0; i < MAX_DEV; ++i) { primary[i].device = i; primary[i].magic = 0x5754; }
}

/* the common head of a call: initialised, no injected failure, no sticky fault */
#define ENTER(name, fmt, ...)                                        \
  pthread_mutex_lock(&mu);                                           \
  int rc_ = initialised ? injected(name) : E_NOT_INITIALIZED;        \
  if (!rc_ && sticky) rc_ = sticky;                                  \
  if (rc_) { LOG(name, rc_, fmt, ##__VA_ARGS__); pthread_mutex_unlock(&mu); return rc_; }
#define RETURN(name, rc, fmt, ...) \
  do { int r_ = (rc); LOG(name, r_, fmt, ##__VA_ARGS__); pthread_mutex_unlock(&mu); return r_; } while (0)

/* a call a capture forbids: invalidates the capture */
#define NO_CAPTURE(name, fmt, ...) \
  if (capturing) { capture_invalid = 1; RETURN(name, E_CAPTURE_UNSUPPORTED, fmt, ##__VA_ARGS__); }
/* a synchronising call reports a pending fault (and from then on every call does) */
#define SYNC_POINT(name, fmt, ...) \
  if (pending) { sticky = pending; pending = 0; RETURN(name, sticky, fmt, ##__VA_ARGS__); }

static Alloc *find_alloc(u64 p) {
  for (int i = 0; i < nallocs; ++i)
    if (allocs[i].base <= p && p < allocs[i].base + (allocs[i].size ? allocs[i].size : 1)) return &allocs[i];
  return NULL;
}

/* ------------------------------------------------------------------------------ init, devices */
CUresult cuInit(unsigned flags) {
  pthread_mutex_lock(&mu);
  int rc = injected("cuInit");
  if (!rc && !initialised) { init_env(); initialised = 1; }
  if (!rc && ndev < 1) rc = E_NO_DEVICE;
  LOG("cuInit", rc, ", \"flags\": %u", flags);
  pthread_mutex_unlock(&mu);
  return rc;
}

CUresult cuDriverGetVersion(int *v) {
  if (!v) return E_INVALID_VALUE;
  *v = 13000;
  return OK;
}

CUresult cuGetErrorName(int err, const char **s) {
  for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; ++i)
    if (ERRORS[i].code == err) { *s = ERRORS[i].name; return OK; }
  *s = NULL;
  return E_INVALID_VALUE;
}

CUresult cuGetErrorString(int err, const char **s) { return cuGetErrorName(err, s); }

CUresult cuDeviceGetCount(int *n) {
  ENTER("cuDeviceGetCount", "");
  *n = ndev;
  RETURN("cuDeviceGetCount", OK, ", \"count\": %d", ndev);
}

CUresult cuDeviceGet(int *dev, int ordinal) {
  ENTER("cuDeviceGet", ", \"ordinal\": %d", ordinal);
  if (ordinal < 0 || ordinal >= ndev) RETURN("cuDeviceGet", E_INVALID_DEVICE, ", \"ordinal\": %d", ordinal);
  *dev = ordinal;
  RETURN("cuDeviceGet", OK, ", \"ordinal\": %d", ordinal);
}

CUresult cuDeviceGetName(char *name, int len, int dev) {
  ENTER("cuDeviceGetName", ", \"device\": %d", dev);
  if (dev < 0 || dev >= ndev) RETURN("cuDeviceGetName", E_INVALID_DEVICE, ", \"device\": %d", dev);
  snprintf(name, (size_t)len, "Stub H200 %d", dev);
  RETURN("cuDeviceGetName", OK, ", \"device\": %d", dev);
}

static int attribute(int a) {
  switch (a) {
    case 1: return 1024;            /* MAX_THREADS_PER_BLOCK */
    case 8: return 48 * 1024;       /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10: return 32;             /* WARP_SIZE */
    case 12: return 65536;          /* MAX_REGISTERS_PER_BLOCK */
    case 13: return 1980000;        /* CLOCK_RATE */
    case 16: return sms;            /* MULTIPROCESSOR_COUNT */
    case 36: return 2619000;        /* MEMORY_CLOCK_RATE */
    case 37: return 6144;           /* GLOBAL_MEMORY_BUS_WIDTH */
    case 38: return 50331648;       /* L2_CACHE_SIZE */
    case 39: return 2048;           /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 75: return 9;              /* COMPUTE_CAPABILITY_MAJOR */
    case 76: return 0;              /* COMPUTE_CAPABILITY_MINOR */
    case 81: return 233472;         /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 82: return 65536;          /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    case 95: return 1;              /* COOPERATIVE_LAUNCH */
    case 97: return 232448;         /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 106: return 32;            /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    case 111: return 1024;          /* RESERVED_SHARED_MEMORY_PER_BLOCK */
    default: return -1;
  }
}

CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  ENTER("cuDeviceGetAttribute", ", \"attr\": %d, \"device\": %d", attr, dev);
  int x = attribute(attr);
  if (dev < 0 || dev >= ndev) RETURN("cuDeviceGetAttribute", E_INVALID_DEVICE, ", \"attr\": %d, \"device\": %d", attr, dev);
  if (x < 0) RETURN("cuDeviceGetAttribute", E_INVALID_VALUE, ", \"attr\": %d, \"device\": %d", attr, dev);
  *v = x;
  RETURN("cuDeviceGetAttribute", OK, ", \"attr\": %d, \"device\": %d, \"value\": %d", attr, dev, x);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, int dev) {
  ENTER("cuDeviceTotalMem", ", \"device\": %d", dev);
  *bytes = (size_t)150754820096ULL;
  RETURN("cuDeviceTotalMem", OK, ", \"device\": %d", dev);
}

/* ------------------------------------------------------------------------------ contexts */
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  ENTER("cuDevicePrimaryCtxRetain", ", \"device\": %d", dev);
  if (dev < 0 || dev >= ndev) RETURN("cuDevicePrimaryCtxRetain", E_INVALID_DEVICE, ", \"device\": %d", dev);
  retained[dev]++;
  *ctx = &primary[dev];
  RETURN("cuDevicePrimaryCtxRetain", OK, ", \"device\": %d, \"refs\": %d", dev, retained[dev]);
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
  ENTER("cuDevicePrimaryCtxRelease", ", \"device\": %d", dev);
  if (dev < 0 || dev >= ndev || retained[dev] < 1)
    RETURN("cuDevicePrimaryCtxRelease", E_INVALID_CONTEXT, ", \"device\": %d", dev);
  retained[dev]--;
  RETURN("cuDevicePrimaryCtxRelease", OK, ", \"device\": %d, \"refs\": %d", dev, retained[dev]);
}

static int valid_ctx(void *c) {
  for (int i = 0; i < ndev; ++i) if (c == &primary[i]) return retained[i] > 0;
  return 0;
}

static int ctx_dev(void *c) { return c ? ((Ctx *)c)->device : -1; }

CUresult cuCtxSetCurrent(void *ctx) {
  ENTER("cuCtxSetCurrent", ", \"to\": %d", ctx_dev(ctx));
  if (ctx && !valid_ctx(ctx)) RETURN("cuCtxSetCurrent", E_INVALID_CONTEXT, ", \"to\": %d", ctx_dev(ctx));
  if (!ctx) { if (depth) --depth; }
  else if (depth) stack[depth - 1] = ctx;
  else stack[depth++] = ctx;
  RETURN("cuCtxSetCurrent", OK, ", \"to\": %d", ctx_dev(ctx));
}

CUresult cuCtxGetCurrent(void **ctx) {
  ENTER("cuCtxGetCurrent", "");
  *ctx = depth ? stack[depth - 1] : NULL;
  RETURN("cuCtxGetCurrent", OK, "");
}

CUresult cuCtxPushCurrent_v2(void *ctx) {
  ENTER("cuCtxPushCurrent", ", \"to\": %d", ctx_dev(ctx));
  if (!valid_ctx(ctx) || depth == MAX_STACK) RETURN("cuCtxPushCurrent", E_INVALID_CONTEXT, ", \"to\": %d", ctx_dev(ctx));
  stack[depth++] = ctx;
  RETURN("cuCtxPushCurrent", OK, ", \"to\": %d", ctx_dev(ctx));
}

CUresult cuCtxPopCurrent_v2(void **ctx) {
  ENTER("cuCtxPopCurrent", "");
  if (!depth) RETURN("cuCtxPopCurrent", E_INVALID_CONTEXT, "");
  Ctx *c = stack[--depth];
  if (ctx) *ctx = c;
  RETURN("cuCtxPopCurrent", OK, ", \"popped\": %d", c->device);
}

CUresult cuCtxGetDevice(int *dev) {
  ENTER("cuCtxGetDevice", "");
  if (!depth) RETURN("cuCtxGetDevice", E_INVALID_CONTEXT, "");
  *dev = stack[depth - 1]->device;
  RETURN("cuCtxGetDevice", OK, "");
}

#define NEED_CTX(name, fmt, ...) if (!depth) RETURN(name, E_INVALID_CONTEXT, fmt, ##__VA_ARGS__);

CUresult cuCtxSynchronize(void) {
  ENTER("cuCtxSynchronize", "");
  NEED_CTX("cuCtxSynchronize", "");
  NO_CAPTURE("cuCtxSynchronize", "");
  SYNC_POINT("cuCtxSynchronize", "");
  RETURN("cuCtxSynchronize", OK, "");
}

/* ------------------------------------------------------------------------------ memory */
CUresult cuMemAlloc_v2(u64 *dptr, size_t size) {
  ENTER("cuMemAlloc", ", \"bytes\": %zu", size);
  NEED_CTX("cuMemAlloc", ", \"bytes\": %zu", size);
  NO_CAPTURE("cuMemAlloc", ", \"bytes\": %zu", size);
  void *p = NULL;
  if (size == 0) RETURN("cuMemAlloc", E_INVALID_VALUE, ", \"bytes\": 0");
  if (nallocs == 4096 || posix_memalign(&p, 256, size)) RETURN("cuMemAlloc", E_OUT_OF_MEMORY, ", \"bytes\": %zu", size);
  allocs[nallocs].base = (u64)(uintptr_t)p;
  allocs[nallocs++].size = size;
  *dptr = (u64)(uintptr_t)p;
  RETURN("cuMemAlloc", OK, ", \"bytes\": %zu, \"ptr\": %llu", size, (unsigned long long)*dptr);
}

CUresult cuMemFree_v2(u64 dptr) {
  ENTER("cuMemFree", ", \"ptr\": %llu", (unsigned long long)dptr);
  NO_CAPTURE("cuMemFree", ", \"ptr\": %llu", (unsigned long long)dptr);
  for (int i = 0; i < nallocs; ++i)
    if (allocs[i].base == dptr) {
      free((void *)(uintptr_t)dptr);
      allocs[i] = allocs[--nallocs];
      RETURN("cuMemFree", OK, ", \"ptr\": %llu", (unsigned long long)dptr);
    }
  RETURN("cuMemFree", E_INVALID_VALUE, ", \"ptr\": %llu", (unsigned long long)dptr);
}

CUresult cuMemAllocHost_v2(void **p, size_t size) {
  ENTER("cuMemAllocHost", ", \"bytes\": %zu", size);
  NEED_CTX("cuMemAllocHost", ", \"bytes\": %zu", size);
  NO_CAPTURE("cuMemAllocHost", ", \"bytes\": %zu", size);
  if (posix_memalign(p, 4096, size ? size : 1)) RETURN("cuMemAllocHost", E_OUT_OF_MEMORY, ", \"bytes\": %zu", size);
  RETURN("cuMemAllocHost", OK, ", \"bytes\": %zu, \"ptr\": %llu", size, (unsigned long long)(uintptr_t)*p);
}

CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags) {
  ENTER("cuMemHostAlloc", ", \"bytes\": %zu, \"flags\": %u", size, flags);
  NEED_CTX("cuMemHostAlloc", ", \"bytes\": %zu", size);
  NO_CAPTURE("cuMemHostAlloc", ", \"bytes\": %zu", size);
  if (posix_memalign(p, 4096, size ? size : 1)) RETURN("cuMemHostAlloc", E_OUT_OF_MEMORY, ", \"bytes\": %zu", size);
  RETURN("cuMemHostAlloc", OK, ", \"bytes\": %zu, \"flags\": %u", size, flags);
}

/* a mapped page-locked buffer's device pointer: the host address itself (unified addressing) */
CUresult cuMemHostGetDevicePointer_v2(u64 *dptr, void *p, unsigned flags) {
  ENTER("cuMemHostGetDevicePointer", ", \"ptr\": %llu", (unsigned long long)(uintptr_t)p);
  if (flags) RETURN("cuMemHostGetDevicePointer", E_INVALID_VALUE, ", \"ptr\": %llu", (unsigned long long)(uintptr_t)p);
  *dptr = (u64)(uintptr_t)p;
  RETURN("cuMemHostGetDevicePointer", OK, ", \"ptr\": %llu", (unsigned long long)*dptr);
}

CUresult cuMemFreeHost(void *p) {
  unsigned long long addr = (unsigned long long)(uintptr_t)p;
  ENTER("cuMemFreeHost", ", \"ptr\": %llu", addr);
  free(p);
  RETURN("cuMemFreeHost", OK, ", \"ptr\": %llu", addr);
}

/* a device range [p, p + n) inside one allocation (the stub's own, or any when it knows none of p) */
static int device_range_ok(u64 p, size_t n) {
  Alloc *a = find_alloc(p);
  return a && p + n <= a->base + a->size;
}

static CUresult memset_common(const char *name, u64 p, unsigned char v, size_t n, u64 stream, int sync) {
  ENTER(name, ", \"ptr\": %llu, \"value\": %u, \"bytes\": %zu, \"stream\": %llu",
        (unsigned long long)p, v, n, (unsigned long long)stream);
  NEED_CTX(name, ", \"ptr\": %llu, \"value\": %u, \"bytes\": %zu, \"stream\": %llu",
           (unsigned long long)p, v, n, (unsigned long long)stream);
  if (sync || (capturing && stream != capturing && stream == 0)) {
    NO_CAPTURE(name, ", \"ptr\": %llu, \"value\": %u, \"bytes\": %zu, \"stream\": %llu",
               (unsigned long long)p, v, n, (unsigned long long)stream);
  }
  if (!device_range_ok(p, n))
    RETURN(name, E_INVALID_VALUE, ", \"ptr\": %llu, \"value\": %u, \"bytes\": %zu, \"stream\": %llu",
           (unsigned long long)p, v, n, (unsigned long long)stream);
  memset((void *)(uintptr_t)p, v, n);
  RETURN(name, OK, ", \"ptr\": %llu, \"value\": %u, \"bytes\": %zu, \"stream\": %llu",
         (unsigned long long)p, v, n, (unsigned long long)stream);
}

CUresult cuMemsetD8Async(u64 p, unsigned char v, size_t n, u64 stream) {
  return memset_common("cuMemsetD8Async", p, v, n, stream, 0);
}
CUresult cuMemsetD8Async_ptsz(u64 p, unsigned char v, size_t n, u64 stream) {
  return memset_common("cuMemsetD8Async", p, v, n, stream, 0);
}
CUresult cuMemsetD8_v2(u64 p, unsigned char v, size_t n) { return memset_common("cuMemsetD8", p, v, n, 0, 1); }

static CUresult copy_common(const char *name, void *dst, const void *src, size_t n, u64 dev, u64 stream, int sync) {
  ENTER(name, ", \"device_ptr\": %llu, \"bytes\": %zu, \"stream\": %llu", (unsigned long long)dev, n,
        (unsigned long long)stream);
  NEED_CTX(name, ", \"device_ptr\": %llu, \"bytes\": %zu, \"stream\": %llu", (unsigned long long)dev, n,
           (unsigned long long)stream);
  if (sync) {
    NO_CAPTURE(name, ", \"device_ptr\": %llu, \"bytes\": %zu, \"stream\": %llu", (unsigned long long)dev, n,
               (unsigned long long)stream);
    SYNC_POINT(name, ", \"device_ptr\": %llu, \"bytes\": %zu, \"stream\": %llu", (unsigned long long)dev, n,
               (unsigned long long)stream);
  }
  if (!device_range_ok(dev, n))
    RETURN(name, E_INVALID_VALUE, ", \"device_ptr\": %llu, \"bytes\": %zu, \"stream\": %llu",
           (unsigned long long)dev, n, (unsigned long long)stream);
  memcpy(dst, src, n);
  RETURN(name, OK, ", \"device_ptr\": %llu, \"bytes\": %zu, \"stream\": %llu", (unsigned long long)dev, n,
         (unsigned long long)stream);
}

CUresult cuMemcpyHtoD_v2(u64 dst, const void *src, size_t n) {
  return copy_common("cuMemcpyHtoD", (void *)(uintptr_t)dst, src, n, dst, 0, 1);
}
CUresult cuMemcpyDtoH_v2(void *dst, u64 src, size_t n) {
  return copy_common("cuMemcpyDtoH", dst, (const void *)(uintptr_t)src, n, src, 0, 1);
}
CUresult cuMemcpyHtoDAsync_v2(u64 dst, const void *src, size_t n, u64 stream) {
  return copy_common("cuMemcpyHtoDAsync", (void *)(uintptr_t)dst, src, n, dst, stream, 0);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, u64 src, size_t n, u64 stream) {
  return copy_common("cuMemcpyDtoHAsync", dst, (const void *)(uintptr_t)src, n, src, stream, 0);
}

/* ------------------------------------------------------------------------------ modules, functions */
CUresult cuModuleLoadData(void **mod, const void *image) {
  ENTER("cuModuleLoadData", "");
  NEED_CTX("cuModuleLoadData", "");
  NO_CAPTURE("cuModuleLoadData", "");
  const char *s = image;
  if (!s || strncmp(s, "STUBCUBIN", 9)) RETURN("cuModuleLoadData", E_INVALID_IMAGE, "");
  Module *m = calloc(1, sizeof *m);
  const char *p = s + 9;
  char name[128];
  int np, used;
  while (m->nfuncs < 64 && sscanf(p, " %127[^: ]:%d%n", name, &np, &used) == 2) {
    Func *f = &m->funcs[m->nfuncs++];
    snprintf(f->name, sizeof f->name, "%s", name);
    f->nparams = np;
    f->max_dyn_smem = SMEM_DEFAULT;
    f->module = m;
    p += used;
  }
  *mod = m;
  RETURN("cuModuleLoadData", OK, ", \"kernels\": %d, \"module\": %llu", m->nfuncs,
         (unsigned long long)(uintptr_t)m);
}

CUresult cuModuleLoad(void **mod, const char *fname) {
  char buf[4096] = "";
  FILE *f = fopen(fname, "rb");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = 0;
  if (!f) {
    pthread_mutex_lock(&mu);
    RETURN("cuModuleLoad", E_NOT_FOUND, ", \"file\": \"%s\"", fname);
  }
  return cuModuleLoadData(mod, buf);
}

CUresult cuModuleLoadDataEx(void **mod, const void *image, unsigned n, void *options, void **values) {
  (void)n; (void)options; (void)values;
  return cuModuleLoadData(mod, image);
}

CUresult cuModuleUnload(void *mod) {
  ENTER("cuModuleUnload", ", \"module\": %llu", (unsigned long long)(uintptr_t)mod);
  NO_CAPTURE("cuModuleUnload", ", \"module\": %llu", (unsigned long long)(uintptr_t)mod);
  if (!mod) RETURN("cuModuleUnload", E_INVALID_HANDLE, "");
  ((Module *)mod)->nfuncs = -1;  /* kept (its functions may still be named in the log), marked unloaded */
  RETURN("cuModuleUnload", OK, ", \"module\": %llu", (unsigned long long)(uintptr_t)mod);
}

CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
  ENTER("cuModuleGetFunction", ", \"name\": \"%s\"", name);
  Module *m = mod;
  if (!m || m->nfuncs < 0) RETURN("cuModuleGetFunction", E_INVALID_HANDLE, ", \"name\": \"%s\"", name);
  for (int i = 0; i < m->nfuncs; ++i)
    if (!strcmp(m->funcs[i].name, name)) {
      *fn = &m->funcs[i];
      RETURN("cuModuleGetFunction", OK, ", \"name\": \"%s\"", name);
    }
  RETURN("cuModuleGetFunction", E_NOT_FOUND, ", \"name\": \"%s\"", name);
}

CUresult cuFuncSetAttribute(void *fn, int attr, int value) {
  Func *f = fn;
  ENTER("cuFuncSetAttribute", ", \"kernel\": \"%s\", \"attr\": %d, \"value\": %d", f ? f->name : "", attr, value);
  if (!f) RETURN("cuFuncSetAttribute", E_INVALID_HANDLE, "");
  if (attr == 8) {  /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
    if (value > attribute(97) - attribute(111) + 1024 || value < 0)
      RETURN("cuFuncSetAttribute", E_INVALID_VALUE, ", \"kernel\": \"%s\", \"attr\": %d, \"value\": %d", f->name, attr, value);
    f->max_dyn_smem = value;
  }
  RETURN("cuFuncSetAttribute", OK, ", \"kernel\": \"%s\", \"attr\": %d, \"value\": %d", f->name, attr, value);
}

CUresult cuFuncGetAttribute(int *v, int attr, void *fn) {
  Func *f = fn;
  ENTER("cuFuncGetAttribute", ", \"attr\": %d", attr);
  if (!f) RETURN("cuFuncGetAttribute", E_INVALID_HANDLE, "");
  *v = attr == 8 ? f->max_dyn_smem : attr == 0 ? 1024 : attr == 4 ? 32 : 0;
  RETURN("cuFuncGetAttribute", OK, ", \"kernel\": \"%s\", \"attr\": %d", f->name, attr);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *fn, int block, size_t smem) {
  Func *f = fn;
  ENTER("cuOccupancyMaxActiveBlocksPerMultiprocessor", ", \"block\": %d, \"smem\": %zu", block, smem);
  if (!f) RETURN("cuOccupancyMaxActiveBlocksPerMultiprocessor", E_INVALID_HANDLE, "");
  *n = occupancy;
  RETURN("cuOccupancyMaxActiveBlocksPerMultiprocessor", OK, ", \"kernel\": \"%s\", \"block\": %d, \"smem\": %zu, "
         "\"blocks\": %d", f->name, block, smem, occupancy);
}

/* ------------------------------------------------------------------------------ launches */
/* a CUDA graph: the kernel launches captured on a stream, in order (their argument values as captured) */
#define MAX_NODES 256
typedef struct { Func *f; unsigned grid; int coop; int nvals; u64 vals[64]; } Node;
typedef struct { int magic; int n; Node nodes[MAX_NODES]; } Graph;
static Node captured[MAX_NODES];
static int ncaptured = 0;

static int fault_now(void) {
  const char *spec = getenv("STUB_CUDA_FAULT"), *mark = getenv("STUB_CUDA_FAULT_MARK");
  int code = 0, at = 1;
  if (!spec || sscanf(spec, "%d@%d", &code, &at) < 1 || launches != at) return 0;
  if (mark && *mark) {
    FILE *m = fopen(mark, "r");
    if (m) { fclose(m); return 0; }
    m = fopen(mark, "w");
    if (m) fclose(m);
  }
  return code;
}

/* the "copy" kernel: first argument's allocation into the second's */
static void run_kernel(Func *f, const u64 *vals, int n) {
  if (strncmp(f->name, "copy", 4) || n < 2) return;
  Alloc *src = find_alloc(vals[0]), *dst = find_alloc(vals[1]);
  if (!src || !dst) return;
  size_t a = src->base + src->size - vals[0], b = dst->base + dst->size - vals[1];
  memmove((void *)(uintptr_t)vals[1], (const void *)(uintptr_t)vals[0], a < b ? a : b);
}

static CUresult launch_common(const char *name, int coop, void *fn, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz, unsigned smem, u64 stream, void **params,
                              void **extra) {
  Func *f = fn;
  char args[2048] = "";
  size_t off = 0;
  int misaligned = 0, nvals = 0;
  u64 vals[64];
  /* the arguments: kernelParams (void*[n], each pointing at its value) or, as pycuda passes them,
     extra = {CU_LAUNCH_PARAM_BUFFER_POINTER (1), buf, CU_LAUNCH_PARAM_BUFFER_SIZE (2), &size, END (0)} */
  const u64 *packed = NULL;
  int bad_extra = 0;
  if (extra) {
    if (extra[0] == (void *)1 && extra[2] == (void *)2 && extra[4] == NULL) {
      packed = extra[1];
      if (f && *(size_t *)extra[3] != (size_t)f->nparams * 8) bad_extra = 1;
    } else bad_extra = 1;
  }
  pthread_mutex_lock(&mu);
  ++launches;
  if (f && f->module && ((Module *)f->module)->nfuncs >= 0 && !bad_extra)
    for (int i = 0; i < f->nparams && (params || packed); ++i) {
      u64 v = packed ? packed[i] : *(u64 *)params[i];
      if (v % 16) misaligned = 1;
      if (nvals < 64) vals[nvals++] = v;
      off += (size_t)snprintf(args + off, sizeof args - off, "%s%llu", i ? ", " : "", (unsigned long long)v);
      if (off >= sizeof args) break;
    }
  pthread_mutex_unlock(&mu);
#define LFMT ", \"kernel\": \"%s\", \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u], \"smem\": %u, " \
             "\"stream\": %llu, \"args\": [%s], \"cooperative\": %d, \"capturing\": %d"
#define LARGS f ? f->name : "", gx, gy, gz, bx, by, bz, smem, (unsigned long long)stream, args, coop, \
              capturing != 0 && capturing == stream
  ENTER(name, LFMT, LARGS);
  NEED_CTX(name, LFMT, LARGS);
  if (!f || !f->module || ((Module *)f->module)->nfuncs < 0) RETURN(name, E_INVALID_HANDLE, LFMT, LARGS);
  if (bad_extra || (params && extra)) RETURN(name, E_INVALID_VALUE, LFMT, LARGS);
  if (f->nparams && !params && !packed) RETURN(name, E_INVALID_VALUE, LFMT, LARGS);
  if ((int)smem > f->max_dyn_smem) RETURN(name, E_INVALID_VALUE, LFMT, LARGS);
  if (!gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024) RETURN(name, E_INVALID_VALUE, LFMT, LARGS);
  if (coop && (unsigned long long)gx * gy * gz > (unsigned long long)sms * occupancy)
    RETURN(name, E_COOP_TOO_LARGE, LFMT, LARGS);
  if (capturing && stream == 0 && capturing != stream) { capture_invalid = 1; RETURN(name, E_CAPTURE_UNSUPPORTED, LFMT, LARGS); }
  if (capturing && capturing == stream) {   /* captured: recorded into the graph, not run */
    if (ncaptured < MAX_NODES) {
      Node *nd = &captured[ncaptured++];
      nd->f = f; nd->grid = gx; nd->coop = coop; nd->nvals = nvals;
      memcpy(nd->vals, vals, sizeof(u64) * (size_t)nvals);
    }
    RETURN(name, OK, LFMT, LARGS);
  }
  int fault = fault_now();
  if (fault && !pending) pending = fault;
  if (misaligned && !pending) pending = E_MISALIGNED;
  if (!pending) run_kernel(f, vals, nvals);
  RETURN(name, OK, LFMT, LARGS);
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, u64 stream, void **params, void **extra) {
  return launch_common("cuLaunchKernel", 0, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
}
CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned smem, u64 stream, void **params, void **extra) {
  return launch_common("cuLaunchKernel", 0, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
}
CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned smem, u64 stream, void **params) {
  return launch_common("cuLaunchCooperativeKernel", 1, f, gx, gy, gz, bx, by, bz, smem, stream, params, NULL);
}
CUresult cuLaunchCooperativeKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                        unsigned bz, unsigned smem, u64 stream, void **params) {
  return launch_common("cuLaunchCooperativeKernel", 1, f, gx, gy, gz, bx, by, bz, smem, stream, params, NULL);
}

/* ------------------------------------------------------------------------------ streams, events */
CUresult cuStreamSynchronize(u64 stream) {
  ENTER("cuStreamSynchronize", ", \"stream\": %llu", (unsigned long long)stream);
  if (capturing && capturing == stream) {
    capture_invalid = 1;
    RETURN("cuStreamSynchronize", E_CAPTURE_UNSUPPORTED, ", \"stream\": %llu", (unsigned long long)stream);
  }
  SYNC_POINT("cuStreamSynchronize", ", \"stream\": %llu", (unsigned long long)stream);
  RETURN("cuStreamSynchronize", OK, ", \"stream\": %llu", (unsigned long long)stream);
}

CUresult cuStreamBeginCapture_v2(u64 stream, int mode) {
  ENTER("cuStreamBeginCapture", ", \"stream\": %llu, \"mode\": %d", (unsigned long long)stream, mode);
  if (!stream || capturing) RETURN("cuStreamBeginCapture", E_NOT_SUPPORTED, ", \"stream\": %llu", (unsigned long long)stream);
  capturing = stream;
  capture_invalid = 0;
  ncaptured = 0;
  RETURN("cuStreamBeginCapture", OK, ", \"stream\": %llu, \"mode\": %d", (unsigned long long)stream, mode);
}
CUresult cuStreamBeginCapture_v2_ptsz(u64 stream, int mode) { return cuStreamBeginCapture_v2(stream, mode); }

CUresult cuStreamEndCapture(u64 stream, void **graph) {
  ENTER("cuStreamEndCapture", ", \"stream\": %llu", (unsigned long long)stream);
  if (capturing != stream || !stream) RETURN("cuStreamEndCapture", E_INVALID_VALUE, ", \"stream\": %llu", (unsigned long long)stream);
  int bad = capture_invalid;
  capturing = 0;
  capture_invalid = 0;
  if (graph) *graph = NULL;
  if (!bad && graph) {
    Graph *g = calloc(1, sizeof *g);
    g->magic = 0x6752;
    g->n = ncaptured;
    memcpy(g->nodes, captured, sizeof(Node) * (size_t)ncaptured);
    *graph = g;
  }
  RETURN("cuStreamEndCapture", bad ? E_CAPTURE_INVALIDATED : OK, ", \"stream\": %llu, \"nodes\": %d",
         (unsigned long long)stream, bad ? 0 : ncaptured);
}

/* an executable graph is a copy of the graph (flags, and the legacy overload's error arguments, ignored) */
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  (void)flags;
  ENTER("cuGraphInstantiate", "");
  Graph *g = graph;
  if (!g || g->magic != 0x6752) RETURN("cuGraphInstantiate", E_INVALID_VALUE, "");
  Graph *e = malloc(sizeof *e);
  memcpy(e, g, sizeof *e);
  *exec = e;
  RETURN("cuGraphInstantiate", OK, ", \"nodes\": %d", e->n);
}

/* a replay: every captured launch again, in order, on `stream` (each logged as a "graph_node") */
CUresult cuGraphLaunch(void *exec, u64 stream) {
  ENTER("cuGraphLaunch", ", \"stream\": %llu", (unsigned long long)stream);
  Graph *e = exec;
  if (!e || e->magic != 0x6752) RETURN("cuGraphLaunch", E_INVALID_VALUE, ", \"stream\": %llu", (unsigned long long)stream);
  if (capturing && capturing == stream) {
    capture_invalid = 1;
    RETURN("cuGraphLaunch", E_CAPTURE_UNSUPPORTED, ", \"stream\": %llu", (unsigned long long)stream);
  }
  for (int i = 0; i < e->n; ++i) {
    Node *nd = &e->nodes[i];
    char args[2048] = "";
    size_t off = 0;
    for (int j = 0; j < nd->nvals && off < sizeof args; ++j)
      off += (size_t)snprintf(args + off, sizeof args - off, "%s%llu", j ? ", " : "", (unsigned long long)nd->vals[j]);
    LOG("graph_node", OK, ", \"kernel\": \"%s\", \"grid\": %u, \"stream\": %llu, \"args\": [%s], \"cooperative\": %d",
        nd->f->name, nd->grid, (unsigned long long)stream, args, nd->coop);
    if (!pending) run_kernel(nd->f, nd->vals, nd->nvals);
  }
  RETURN("cuGraphLaunch", OK, ", \"stream\": %llu, \"nodes\": %d", (unsigned long long)stream, e->n);
}
CUresult cuGraphLaunch_ptsz(void *exec, u64 stream) { return cuGraphLaunch(exec, stream); }

CUresult cuGraphExecDestroy(void *exec) {
  ENTER("cuGraphExecDestroy", "");
  free(exec);
  RETURN("cuGraphExecDestroy", OK, "");
}

CUresult cuGraphDestroy(void *graph) {
  ENTER("cuGraphDestroy", "");
  free(graph);
  RETURN("cuGraphDestroy", OK, "");
}
CUresult cuStreamEndCapture_ptsz(u64 stream, void **graph) { return cuStreamEndCapture(stream, graph); }

CUresult cuStreamIsCapturing(u64 stream, int *status) {
  ENTER("cuStreamIsCapturing", ", \"stream\": %llu", (unsigned long long)stream);
  *status = capturing && capturing == stream ? (capture_invalid ? 2 : 1) : 0;
  RETURN("cuStreamIsCapturing", OK, ", \"stream\": %llu, \"status\": %d", (unsigned long long)stream, *status);
}
CUresult cuStreamIsCapturing_ptsz(u64 stream, int *status) { return cuStreamIsCapturing(stream, status); }

typedef struct { double t; int recorded; } Event;

CUresult cuEventCreate(void **ev, unsigned flags) {
  ENTER("cuEventCreate", ", \"flags\": %u", flags);
  Event *e = calloc(1, sizeof *e);
  *ev = e;
  RETURN("cuEventCreate", OK, ", \"flags\": %u", flags);
}

CUresult cuEventDestroy_v2(void *ev) {
  ENTER("cuEventDestroy", "");
  free(ev);
  RETURN("cuEventDestroy", OK, "");
}

CUresult cuEventRecord(void *ev, u64 stream) {
  ENTER("cuEventRecord", ", \"stream\": %llu", (unsigned long long)stream);
  Event *e = ev;
  if (!e) RETURN("cuEventRecord", E_INVALID_HANDLE, "");
  e->t = (double)launches;  /* "time" = launches so far: an elapsed time counts the launches between */
  e->recorded = 1;
  RETURN("cuEventRecord", OK, ", \"stream\": %llu", (unsigned long long)stream);
}
CUresult cuEventRecord_ptsz(void *ev, u64 stream) { return cuEventRecord(ev, stream); }

CUresult cuEventSynchronize(void *ev) {
  ENTER("cuEventSynchronize", "");
  SYNC_POINT("cuEventSynchronize", "");
  RETURN("cuEventSynchronize", OK, "");
}

CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
  ENTER("cuEventElapsedTime", "");
  Event *s = a, *e = b;
  if (!s || !e || !s->recorded || !e->recorded) RETURN("cuEventElapsedTime", E_INVALID_HANDLE, "");
  *ms = (float)((e->t - s->t) * 0.001);  /* 1 us per launch */
  RETURN("cuEventElapsedTime", OK, "");
}
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { return cuEventElapsedTime_v2(ms, a, b); }

/* ------------------------------------------------------------------------------ symbol lookup */
typedef struct { const char *name; void *fn; } Sym;
#define S(n, f) {n, (void *)f}
static const Sym SYMS[] = {
  S("cuInit", cuInit), S("cuDriverGetVersion", cuDriverGetVersion), S("cuGetErrorName", cuGetErrorName),
  S("cuGetErrorString", cuGetErrorString), S("cuDeviceGetCount", cuDeviceGetCount), S("cuDeviceGet", cuDeviceGet),
  S("cuDeviceGetName", cuDeviceGetName), S("cuDeviceGetAttribute", cuDeviceGetAttribute),
  S("cuDeviceTotalMem", cuDeviceTotalMem_v2), S("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain),
  S("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2), S("cuCtxSetCurrent", cuCtxSetCurrent),
  S("cuCtxGetCurrent", cuCtxGetCurrent), S("cuCtxPushCurrent", cuCtxPushCurrent_v2),
  S("cuCtxPopCurrent", cuCtxPopCurrent_v2), S("cuCtxGetDevice", cuCtxGetDevice),
  S("cuCtxSynchronize", cuCtxSynchronize), S("cuMemAlloc", cuMemAlloc_v2), S("cuMemFree", cuMemFree_v2),
  S("cuMemAllocHost", cuMemAllocHost_v2), S("cuMemHostAlloc", cuMemHostAlloc), S("cuMemFreeHost", cuMemFreeHost),
  S("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2),
  S("cuMemsetD8Async", cuMemsetD8Async), S("cuMemsetD8", cuMemsetD8_v2), S("cuMemcpyHtoD", cuMemcpyHtoD_v2),
  S("cuMemcpyDtoH", cuMemcpyDtoH_v2), S("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2),
  S("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2), S("cuModuleLoadData", cuModuleLoadData),
  S("cuModuleLoadDataEx", cuModuleLoadDataEx), S("cuModuleLoad", cuModuleLoad),
  S("cuModuleUnload", cuModuleUnload), S("cuModuleGetFunction", cuModuleGetFunction),
  S("cuFuncSetAttribute", cuFuncSetAttribute), S("cuFuncGetAttribute", cuFuncGetAttribute),
  S("cuOccupancyMaxActiveBlocksPerMultiprocessor", cuOccupancyMaxActiveBlocksPerMultiprocessor),
  S("cuLaunchKernel", cuLaunchKernel), S("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel),
  S("cuStreamSynchronize", cuStreamSynchronize), S("cuStreamBeginCapture", cuStreamBeginCapture_v2),
  S("cuStreamEndCapture", cuStreamEndCapture), S("cuStreamIsCapturing", cuStreamIsCapturing),
  S("cuEventCreate", cuEventCreate), S("cuEventDestroy", cuEventDestroy_v2), S("cuEventRecord", cuEventRecord),
  S("cuEventSynchronize", cuEventSynchronize), S("cuEventElapsedTime", cuEventElapsedTime_v2),
  S("cuGraphInstantiate", cuGraphInstantiateWithFlags), S("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags),
  S("cuGraphLaunch", cuGraphLaunch), S("cuGraphExecDestroy", cuGraphExecDestroy), S("cuGraphDestroy", cuGraphDestroy),
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, u64 flags, int *status) {
  (void)version; (void)flags;
  for (size_t i = 0; i < sizeof SYMS / sizeof SYMS[0]; ++i)
    if (!strcmp(SYMS[i].name, symbol)) {
      *pfn = SYMS[i].fn;
      if (status) *status = 0;
      return OK;
    }
  *pfn = NULL;
  if (status) *status = 1;  /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
  return E_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, u64 flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int version, u64 flags, int *status) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, status);
}
