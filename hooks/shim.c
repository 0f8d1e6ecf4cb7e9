/* libdtr.so: the light preload shim. It links nothing but libc/libdl, so a preloaded process that
 * never loads torch (shells, compilers, /bin/true) pays only for this object. It loads the heavy
 * libdtr_torch.so (from its own directory) as soon as libtorch_cpu is present in the process:
 * at start-up for programs linked against LibTorch, or right after the dlopen that brought it in
 * (Python's `import torch`). It also wraps pthread_create so every thread created after
 * activation has DispatchKey::Fake included (plain std::thread / Python threading do not inherit
 * dispatch TLS).
 *
 * Caveat: dlopen is caller-sensitive (the caller's RUNPATH is searched for bare names); through
 * this wrapper the caller is the shim, which has no RUNPATH. Python and LibTorch load by absolute
 * path; programs relying on their own RUNPATH for dlopen of bare names may not find the library
 * under the preload. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void* (*real_dlopen)(const char*, int);
static int (*real_pthread_create)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
static void (*thread_init)(void);
static __thread int dlopen_depth;
static volatile int state; /* 0: torch not seen yet, 1: active, 2: tried (failed or disabled) */
/* Set by our constructor. Before it, the process is still running start-up initializers (a
 * LibTorch program's libGLdispatch calls dlopen(NULL) from its own initializer): loading the
 * integration from inside another library's initializer crashed, so start-up waits for it. */
static volatile int constructed;

static int find_torch(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  (void)data;
  return info->dlpi_name != NULL && strstr(info->dlpi_name, "libtorch_cpu.so") != NULL;
}

static void maybe_activate(void) {
  if (state != 0) return;
  const char* en = getenv("DTR_ENABLE");
  if (en != NULL && strcmp(en, "0") == 0) {
    state = 2;
    return;
  }
  if (!dl_iterate_phdr(find_torch, NULL)) return;
  state = 2;
  Dl_info di;
  char path[4096];
  if (!dladdr((void*)&maybe_activate, &di) || di.dli_fname == NULL) return;
  const char* slash = strrchr(di.dli_fname, '/');
  size_t dir = slash ? (size_t)(slash - di.dli_fname + 1) : 0;
  if (dir + sizeof("libdtr_torch.so") > sizeof(path)) return;
  memcpy(path, di.dli_fname, dir);
  strcpy(path + dir, "libdtr_torch.so");
  if (real_dlopen == NULL) real_dlopen = (void* (*)(const char*, int))dlsym(RTLD_NEXT, "dlopen");
  void* h = real_dlopen(path, RTLD_NOW | RTLD_GLOBAL); /* its constructor activates dtr */
  if (h == NULL) {
    fprintf(stderr, "dtr: cannot load %s: %s\n", path, dlerror());
    return;
  }
  int (*is_active)(void) = (int (*)(void))dlsym(h, "dtr_is_active");
  thread_init = (void (*)(void))dlsym(h, "dtr_thread_init");
  if (is_active != NULL && is_active()) state = 1;
}

__attribute__((visibility("default"))) void* dlopen(const char* file, int mode) {
  if (real_dlopen == NULL) real_dlopen = (void* (*)(const char*, int))dlsym(RTLD_NEXT, "dlopen");
  /* Only after the outermost dlopen returned: objects are listed by dl_iterate_phdr as soon as
   * they are mapped, and a constructor that calls dlopen may run before libtorch's initializers. */
  ++dlopen_depth;
  void* r = real_dlopen(file, mode);
  --dlopen_depth;
  if (r != NULL && state == 0 && dlopen_depth == 0 && constructed) maybe_activate();
  return r;
}

struct tramp {
  void* (*fn)(void*);
  void* arg;
};

static void* trampoline(void* p) {
  struct tramp t = *(struct tramp*)p;
  free(p);
  if (thread_init != NULL) thread_init();
  return t.fn(t.arg);
}

__attribute__((visibility("default"))) int pthread_create(pthread_t* th, const pthread_attr_t* attr,
                                                          void* (*fn)(void*), void* arg) {
  if (real_pthread_create == NULL)
    real_pthread_create = (int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*))dlsym(
        RTLD_NEXT, "pthread_create");
  if (state != 1 || thread_init == NULL) return real_pthread_create(th, attr, fn, arg);
  struct tramp* t = (struct tramp*)malloc(sizeof *t);
  if (t == NULL) return real_pthread_create(th, attr, fn, arg);
  t->fn = fn;
  t->arg = arg;
  int r = real_pthread_create(th, attr, trampoline, t);
  if (r != 0) free(t);
  return r;
}

__attribute__((constructor)) static void dtr_shim_init(void) {
  constructed = 1;
  maybe_activate();
}
