/* dtr's C API, for LibTorch C++ programs that link dtr (find_package(dtr), target dtr::dtr).
 * Linking is enough to run under dtr: the library activates at start-up from the DTR_*
 * environment (DTR_BUDGET=6GiB, ...), as LD_PRELOAD would. These functions add control and
 * introspection; all are safe to call whether dtr is active or not. */
#ifndef DTR_DTR_H_
#define DTR_DTR_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activates dtr from the environment if it is not active yet. 0: active (or disabled by
 * DTR_ENABLE=0); 1: cannot activate (the message went to stderr). Exits with status 2 on a
 * malformed DTR_* variable. */
int dtr_activate(void);
/* 1 while dtr manages this process's tensors. */
int dtr_is_active(void);
/* dtr's statistics as one JSON object ("{}" when inactive). The pointer stays valid until the
 * calling thread's next call. */
const char* dtr_stats_json(void);
/* Changes the budget (bytes; <= 0: unlimited). 0 on success, 1 if the memory that cannot be
 * evicted does not fit (the old budget stays; the reason went to stderr), 2 when inactive. */
int dtr_set_budget(int64_t bytes);
/* Gives the calling thread dtr's dispatch key. Threads created with pthread_create under the
 * preload get it automatically; in a program that links dtr, call it first thing in each thread
 * that touches tensors. */
void dtr_thread_init(void);

#ifdef __cplusplus
}
#endif

#endif /* DTR_DTR_H_ */
