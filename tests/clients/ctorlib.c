/* A library whose constructor calls CUDA, as some plugins and framework extensions do: it runs inside
 * dlopen, holding the loader's lock. Used with the fake driver's FAKE_CUDA_DLOPEN_RACE (tests/fake-driver.md):
 * the constructor waits 400 ms first, so the thread that started the race is by then inside the
 * interposer, then resolves a driver function through cuGetProcAddress and says so on stderr. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

__attribute__((constructor)) static void ctor_calls_cuda(void) {
    usleep(400 * 1000);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    gpa_fn gpa = cuda ? (gpa_fn)dlsym(cuda, "cuGetProcAddress_v2") : NULL;
    void *fp = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult rc = gpa ? gpa("cuMemAlloc", &fp, 12000, 0, &st) : CUDA_ERROR_NOT_FOUND;
    fprintf(stderr, "ctorlib: cuGetProcAddress rc=%d found=%d\n", (int)rc, fp != NULL);
}
