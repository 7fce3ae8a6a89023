/* The decode kernels' threads (task_pool.c): swarm_pool_run(task, context, tasks, threads) calls
 * task(context, i, slot) once for each i in [0, tasks), on the calling thread and up to threads - 1 of the
 * pool's, and returns when every call has returned. Tasks are taken as threads come free; slot, in
 * [0, threads), names the thread running the call, for per-thread scratch. */
#pragma once
#include <stdint.h>

typedef void (*swarm_task)(void *context, int64_t task, int slot);

void swarm_pool_run(swarm_task task, void *context, int64_t tasks, int threads);
