/* nvgemm emulator: a fake CUDA runtime (the subset nvgemm's AOT kernel libraries call).
 *
 * Built at run time with gcc into libnvgemm_emucudart.so (its own soname and symbol version node
 * NVGEMM_EMU_1, so it coexists with torch's real libcudart.so.13 in one process); an artifact's
 * kernel.o + shim + DSL static runtime are relinked against it (nvgemm.emulator.cuda).
 *
 * Device memory is host memory (pointers pass through untouched). Device attributes come from a
 * named device profile set by nvemu_set_device. cudaLibraryLoadData keeps the image (a fatbin or an
 * ELF cubin) and its size; cudaLaunchKernelExC decodes the launch (grid, block, dynamic smem,
 * cluster / PDL / cooperative attributes, the kernel's MaxDynamicSharedMemorySize attribute) and
 * hands it with the argument pointers to a callback registered by Python, which executes it and
 * returns a cudaError code. Every other runtime entry point the artifacts import fails loudly with
 * cudaErrorNotSupported. No CUDA headers are needed: the few ABI structs are declared below
 * (CUDA 13 driver_types.h layouts). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef struct { unsigned int x, y, z; } emu_dim3;
typedef struct { int id; char pad[4]; unsigned char val[64]; } emu_attr;               /* cudaLaunchAttribute */
typedef struct {
  emu_dim3 grid, block; size_t dyn_smem; void *stream; emu_attr *attrs; unsigned int num_attrs;
} emu_config;                                                                             /* cudaLaunchConfig_t */

enum { ERR_INVALID_VALUE = 1, ERR_INVALID_DEVICE_FUNCTION = 98, ERR_NOT_SUPPORTED = 801, ERR_LAUNCH_FAILURE = 719 };

#define KERNEL_MAGIC 0x4e56454dU /* "NVEM" */
#define MAX_ATTRS 32

struct emu_library { const void *image; unsigned long long size; };
struct emu_kernel {
  uint32_t magic; struct emu_library *lib; char name[1024];
  int max_dyn_smem; int nonportable_cluster; int set_attrs;
};

/* What the Python callback receives (mirrored by nvgemm.emulator.cuda.LaunchStruct). */
struct nvemu_launch {
  const char *kernel_name; const void *image; unsigned long long image_size;
  unsigned int grid[3], block[3], cluster[3];
  unsigned long long dyn_smem; void *stream;
  int pdl, cooperative, n_attrs;
  int attr_ids[MAX_ATTRS];
  int max_dyn_smem_attr, nonportable_cluster;
  void **args;
  unsigned int preferred_cluster[3];   /* 0 0 0: none */
};
typedef int (*nvemu_callback)(const struct nvemu_launch *);

static nvemu_callback g_cb = 0;
static int g_sm_count = 132, g_cc_major = 9, g_cc_minor = 0, g_smem_optin = 232448;
static cudaError_t g_last = 0;

void nvemu_set_callback(nvemu_callback cb) { g_cb = cb; }
void nvemu_set_device(int sm_count, int cc_major, int cc_minor, int smem_optin) {
  g_sm_count = sm_count; g_cc_major = cc_major; g_cc_minor = cc_minor; g_smem_optin = smem_optin;
}

static cudaError_t fail(cudaError_t e, const char *what) {
  fprintf(stderr, "nvgemm emulator fake CUDA runtime: %s\n", what);
  g_last = e;
  return e;
}

cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return 0; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return 0; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? 0 : fail(101, "cudaSetDevice: only device 0 exists"); }
cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return 0; }
cudaError_t cudaGetLastError(void) { cudaError_t e = g_last; g_last = 0; return e; }
const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorEmulated" : "cudaSuccess"; }
const char *cudaGetErrorString(cudaError_t e) { return e ? "error reported by the nvgemm emulator" : "no error"; }
cudaError_t cudaDeviceSynchronize(void) { return 0; }
cudaError_t cudaStreamSynchronize(void *s) { (void)s; return 0; }

cudaError_t cudaLibraryLoadData(void **lib, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv,
                                unsigned nl) {
  (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
  const unsigned char *c = (const unsigned char *)code;
  unsigned long long size = 0;
  if (*(const uint32_t *)c == 0xBA55ED50u) {          /* fatbin: header size (u16 @6) + payload size (u64 @8) */
    size = (unsigned long long)(*(const uint16_t *)(c + 6)) + *(const uint64_t *)(c + 8);
  } else if (c[0] == 0x7f && c[1] == 'E' && c[2] == 'L' && c[3] == 'F') { /* ELF: end of the section headers */
    size = *(const uint64_t *)(c + 0x28) + (unsigned long long)(*(const uint16_t *)(c + 0x3a)) * *(const uint16_t *)(c + 0x3c);
  } else {
    return fail(ERR_INVALID_VALUE, "cudaLibraryLoadData: image is neither a fatbin nor an ELF cubin");
  }
  struct emu_library *l = (struct emu_library *)calloc(1, sizeof *l);
  l->image = code; l->size = size;
  *lib = l;
  return 0;
}
cudaError_t cudaLibraryUnload(void *lib) { free(lib); return 0; }

cudaError_t cudaLibraryGetKernel(void **k, void *lib, const char *name) {
  struct emu_kernel *kk = (struct emu_kernel *)calloc(1, sizeof *kk);
  kk->magic = KERNEL_MAGIC; kk->lib = (struct emu_library *)lib;
  snprintf(kk->name, sizeof kk->name, "%s", name);
  kk->max_dyn_smem = 48 * 1024;
  *k = kk;
  return 0;
}

static cudaError_t set_attr(struct emu_kernel *k, int attr, int value) {
  if (!k || k->magic != KERNEL_MAGIC) return fail(ERR_INVALID_DEVICE_FUNCTION, "attribute set on an unknown kernel handle");
  if (attr == 8) {        /* cudaFuncAttributeMaxDynamicSharedMemorySize */
    if (value < 0 || value > g_smem_optin) return fail(ERR_INVALID_VALUE, "MaxDynamicSharedMemorySize above the device opt-in limit");
    k->max_dyn_smem = value;
  } else if (attr == 14) { /* cudaFuncAttributeNonPortableClusterSizeAllowed */
    k->nonportable_cluster = value;
  } else if (attr == 9 || attr == 10 || attr == 11 || attr == 12 || attr == 13 || attr == 15) {
    /* preferred carveout, cluster dims / scheduling preferences: accepted, no effect on function */
  } else {
    return fail(ERR_INVALID_VALUE, "unsupported kernel attribute");
  }
  k->set_attrs++;
  return 0;
}
cudaError_t cudaKernelSetAttributeForDevice(void *k, int attr, int value, int dev) {
  if (dev != 0) return fail(101, "cudaKernelSetAttributeForDevice: only device 0 exists");
  return set_attr((struct emu_kernel *)k, attr, value);
}
cudaError_t cudaFuncSetAttribute(const void *f, int attr, int value) { return set_attr((struct emu_kernel *)f, attr, value); }

cudaError_t cudaDeviceGetAttribute(int *v, int attr, int dev) {
  if (dev != 0) return fail(101, "cudaDeviceGetAttribute: only device 0 exists");
  switch (attr) {
    case 97: *v = g_smem_optin; return 0;      /* MaxSharedMemoryPerBlockOptin */
    case 8: *v = 48 * 1024; return 0;          /* MaxSharedMemoryPerBlock */
    case 81: *v = 233472; return 0;            /* MaxSharedMemoryPerMultiprocessor */
    case 75: *v = g_cc_major; return 0;
    case 76: *v = g_cc_minor; return 0;
    case 16: *v = g_sm_count; return 0;        /* MultiProcessorCount */
    case 1: *v = 1024; return 0;               /* MaxThreadsPerBlock */
    case 10: *v = 32; return 0;                /* WarpSize */
    case 39: *v = 2048; return 0;              /* MaxThreadsPerMultiProcessor */
    default: {
      char msg[128]; snprintf(msg, sizeof msg, "cudaDeviceGetAttribute: attribute %d is not in the device profile", attr);
      return fail(ERR_INVALID_VALUE, msg);
    }
  }
}

static int fake_cuKernelGetAttribute(int *pi, int attr, void *k, int dev) {
  (void)k; (void)dev;
  if (attr == 1) { *pi = 0; return 0; }        /* CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: no static smem (checked by the runner) */
  if (attr == 0) { *pi = 1024; return 0; }     /* MAX_THREADS_PER_BLOCK */
  fprintf(stderr, "nvgemm emulator fake CUDA runtime: cuKernelGetAttribute %d not emulated\n", attr);
  return 1;
}
static int fake_cuDeviceGet(int *d, int ordinal) { *d = ordinal; return ordinal == 0 ? 0 : 101; }
static int fake_unsupported_driver(void) {
  fprintf(stderr, "nvgemm emulator fake CUDA runtime: driver entry point not emulated\n");
  return 801;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fp, unsigned int ver, unsigned long long flags,
                                             int *status) {
  (void)ver; (void)flags;
  void *p = 0;
  if (!strcmp(sym, "cuKernelGetAttribute")) p = (void *)fake_cuKernelGetAttribute;
  else if (!strcmp(sym, "cuDeviceGet")) p = (void *)fake_cuDeviceGet;
  else {
    fprintf(stderr, "nvgemm emulator fake CUDA runtime: driver entry point %s requested (returns an error when called)\n", sym);
    p = (void *)fake_unsupported_driver;
  }
  *fp = p;
  if (status) *status = 0;
  return 0;
}

cudaError_t cudaLaunchKernelExC(const emu_config *c, const void *func, void **args) {
  const struct emu_kernel *k = (const struct emu_kernel *)func;
  if (!k || k->magic != KERNEL_MAGIC) return fail(ERR_INVALID_DEVICE_FUNCTION, "launch of an unknown kernel handle");
  if (!g_cb) return fail(ERR_LAUNCH_FAILURE, "no emulator callback registered (nvemu_set_callback)");
  struct nvemu_launch L;
  memset(&L, 0, sizeof L);
  L.kernel_name = k->name; L.image = k->lib ? k->lib->image : 0; L.image_size = k->lib ? k->lib->size : 0;
  L.grid[0] = c->grid.x; L.grid[1] = c->grid.y; L.grid[2] = c->grid.z;
  L.block[0] = c->block.x; L.block[1] = c->block.y; L.block[2] = c->block.z;
  L.cluster[0] = L.cluster[1] = L.cluster[2] = 1;
  L.dyn_smem = c->dyn_smem; L.stream = c->stream;
  L.max_dyn_smem_attr = k->max_dyn_smem; L.nonportable_cluster = k->nonportable_cluster;
  L.args = args;
  for (unsigned i = 0; i < c->num_attrs; ++i) {
    const emu_attr *a = &c->attrs[i];
    if (L.n_attrs < MAX_ATTRS) L.attr_ids[L.n_attrs++] = a->id;
    const unsigned int *w = (const unsigned int *)a->val;
    switch (a->id) {
      case 2: L.cooperative = (int)w[0]; break;                                      /* Cooperative */
      case 4: L.cluster[0] = w[0]; L.cluster[1] = w[1]; L.cluster[2] = w[2]; break;  /* ClusterDimension */
      case 6: L.pdl = (int)(a->val[0] != 0); break;                                  /* ProgrammaticStreamSerialization */
      case 5: break;                                                                 /* cluster scheduling preference */
      case 11: L.preferred_cluster[0] = w[0]; L.preferred_cluster[1] = w[1]; L.preferred_cluster[2] = w[2];
        break;                                                                       /* PreferredClusterDimension */
      default: {
        char msg[96];
        snprintf(msg, sizeof msg, "cudaLaunchKernelExC: unsupported launch attribute %d", a->id);
        return fail(ERR_INVALID_VALUE, msg);
      }
    }
  }
  if (c->dyn_smem > (size_t)k->max_dyn_smem)
    return fail(ERR_INVALID_VALUE, "dynamic shared memory above the kernel's MaxDynamicSharedMemorySize attribute");
  int rc = g_cb(&L);
  if (rc) g_last = rc;
  return rc;
}

/* Imported by the DSL's static runtime but never needed to launch: fail loudly. */
#define UNSUPPORTED(name) \
  cudaError_t name(void) { return fail(ERR_NOT_SUPPORTED, #name " is not emulated"); }
UNSUPPORTED(cudaEventCreate) UNSUPPORTED(cudaEventDestroy) UNSUPPORTED(cudaEventElapsedTime)
UNSUPPORTED(cudaEventRecord) UNSUPPORTED(cudaFree) UNSUPPORTED(cudaFreeAsync) UNSUPPORTED(cudaFreeHost)
UNSUPPORTED(cudaGraphDestroy) UNSUPPORTED(cudaGraphExecDestroy) UNSUPPORTED(cudaGraphInstantiate)
UNSUPPORTED(cudaGraphLaunch) UNSUPPORTED(cudaLibraryGetGlobal) UNSUPPORTED(cudaLibraryGetKernelCount)
UNSUPPORTED(cudaLibraryGetManaged) UNSUPPORTED(cudaLibraryGetUnifiedFunction) UNSUPPORTED(cudaLibraryLoadFromFile)
UNSUPPORTED(cudaMalloc) UNSUPPORTED(cudaMallocAsync) UNSUPPORTED(cudaMallocHost) UNSUPPORTED(cudaMallocManaged)
UNSUPPORTED(cudaMemcpy) UNSUPPORTED(cudaMemcpyAsync) UNSUPPORTED(cudaMemset) UNSUPPORTED(cudaMemsetAsync)
UNSUPPORTED(cudaOccupancyMaxActiveBlocksPerMultiprocessor) UNSUPPORTED(cudaProfilerStart)
UNSUPPORTED(cudaProfilerStop) UNSUPPORTED(cudaStreamAddCallback) UNSUPPORTED(cudaStreamBeginCapture)
UNSUPPORTED(cudaStreamCreate) UNSUPPORTED(cudaStreamDestroy) UNSUPPORTED(cudaStreamEndCapture)
UNSUPPORTED(cudaStreamWaitEvent)
