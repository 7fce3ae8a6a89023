/* The threads of the decode kernels (quant_matmul, paged_decode, prefix_attention): one pool in the process,
 * built as a library of its own that the kernels link against.
 *
 * Why not OpenMP's: a decode step runs about a hundred short parallel regions, and between two of them the
 * engine runs Python. OpenMP's threads either spin for the next region (OMP_WAIT_POLICY=ACTIVE, or a spin
 * count) or sleep at once (PASSIVE, engine/cpu_threads.py's choice). Spinning holds a core that other programs
 * on a busy machine need: a preempted thread then stalls every region behind it. Sleeping costs a wake each
 * region, 40-80 µs on a 2-vCPU VM, which was a third of a lone agent's decode step.
 *
 * This pool spins while the machine is quiet and sleeps while it is busy:
 *   - an idle thread spins for the next job (yielding its core each few µs to any thread waiting for it) for
 *     SWARM_POOL_SPIN_US (default 2000) and then sleeps;
 *   - a thread of the pool that was preempted while it spun, or a caller preempted since its last job, means
 *     other threads want these cores: for the next CONTENDED_NS the pool's threads sleep at once, as PASSIVE;
 *   - tasks are taken as threads come free, and a caller waits only for the tasks taken, never for a thread
 *     that has not woken: a thread that is late takes fewer tasks, or none;
 *   - the caller takes tasks from the front and the pool's threads from the back, so that with two threads
 *     each reads one stretch of memory front to back: the kernels' tasks are consecutive stretches of a weight
 *     or a KV cache, and two threads taking tasks in turn from one end streamed a 66 MB weight at 7.6 GB/s,
 *     slower than one thread alone (8.1 GB/s).
 * Each task's arithmetic is the same whichever thread runs it, so results do not depend on any of this.
 *
 * A job is published by writing its fields, then `claim` = its generation (its low GENERATION_BITS) above two
 * counts of the tasks taken, from the front and from the back (both 0), then `generation`. A thread takes a
 * task by adding one to its end's count with a compare-and-swap that expects the generation it read the
 * fields under: so a thread that read the fields of a job that has ended since takes nothing (unless exactly
 * a multiple of 2^GENERATION_BITS jobs were published in between). The caller rewrites the fields only after
 * every task taken has returned (`done`). */
#define _GNU_SOURCE
#include "task_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define MAX_WORKERS 255
#define CONTENDED_NS 50000000LL   /* idle threads sleep at once for 50 ms after contention is seen */
#define OFF_CORE_NS 1000000LL      /* a spinning thread kept off its core this long: a sign of contention */
#define SIGNS_WITHIN_NS 50000000LL /* two signs this close: contention */
#define WATCH_NS 5000000LL         /* a caller looks for its own preemption at most this often */
#define CALLER_SHARE 0.7           /* a caller that ran less of the time since it last looked: a sign */
#define ROUNDS 64                  /* pause instructions between looks at the clock */
#define COUNT_BITS 22              /* of each end's count in `claim`: jobs of up to 2^22 - 1 tasks */
#define GENERATION_BITS (64 - 2 * COUNT_BITS)
#define COUNT_MASK ((1ULL << COUNT_BITS) - 1)
#define MAX_TASKS ((int64_t)COUNT_MASK)

static struct {
    _Atomic(swarm_task) task;
    _Atomic(void *) context;
    _Atomic int64_t tasks;
    _Atomic int workers;                /* of the job: slots 1..workers take tasks */
    _Atomic uint64_t claim;             /* generation, tasks taken from the front, from the back */
    _Atomic int64_t done;               /* tasks of the job returned */
    _Atomic uint32_t generation;
    _Atomic int sleepers;
    _Atomic int64_t quiet_after;        /* monotonic ns before which idle threads sleep at once */
    _Atomic int64_t last_sign[2];       /* of contention, seen by the pool's threads and by callers */
    pthread_mutex_t run_lock;           /* one caller at a time; others run their tasks alone */
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    int started;                        /* worker threads running */
    _Atomic int64_t counts[4];          /* jobs published, of them those that woke a thread, contentions seen
                                           by the pool's threads and by callers */
    int64_t spin_ns;
} pool = {.run_lock = PTHREAD_MUTEX_INITIALIZER, .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER, .last_sign = {-SIGNS_WITHIN_NS - 1, -SIGNS_WITHIN_NS - 1}};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t cpu_ns(void) {   /* of this thread */
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* one sign can be the hypervisor's, or a kernel thread's: two close together are contention */
static void sign_of_contention(int seen_by) {
    const int64_t now = now_ns(), last = atomic_exchange(&pool.last_sign[seen_by - 2], now);
    if (now - last > SIGNS_WITHIN_NS) return;
    atomic_store(&pool.quiet_after, now + CONTENDED_NS);
    atomic_fetch_add_explicit(&pool.counts[seen_by], 1, memory_order_relaxed);
}

static int contended(void) { return now_ns() < atomic_load_explicit(&pool.quiet_after, memory_order_relaxed); }

static uint64_t claim_of(uint32_t g) { return (uint64_t)g << (2 * COUNT_BITS); }

/* runs tasks of job g until none is left to take: from the front for the caller (slot 0), else from the back */
static void take_tasks(uint32_t g, int slot) {
    const swarm_task task = atomic_load_explicit(&pool.task, memory_order_relaxed);
    void *const context = atomic_load_explicit(&pool.context, memory_order_relaxed);
    const int64_t tasks = atomic_load_explicit(&pool.tasks, memory_order_relaxed);
    const uint64_t generation = claim_of(g), step = slot == 0 ? 1ULL << COUNT_BITS : 1;
    for (;;) {
        uint64_t claim = atomic_load_explicit(&pool.claim, memory_order_acquire);
        int64_t front, back;
        do {
            front = (int64_t)(claim >> COUNT_BITS & COUNT_MASK), back = (int64_t)(claim & COUNT_MASK);
            if ((claim & ~(COUNT_MASK << COUNT_BITS | COUNT_MASK)) != generation || front + back >= tasks) return;
        } while (!atomic_compare_exchange_weak_explicit(&pool.claim, &claim, claim + step, memory_order_acquire,
                                                        memory_order_acquire));
        task(context, slot == 0 ? front : tasks - 1 - back, slot);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
    }
}

/* spins, then sleeps, until a job after `seen` is published; returns its generation */
static uint32_t next_generation(uint32_t seen) {
    int64_t looked = now_ns();
    const int64_t until = looked + pool.spin_ns;
    uint32_t g;
    while (!contended()) {
        for (int round = 0; round < ROUNDS; round++) {
            if ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) != seen) return g;
            cpu_relax();
        }
        sched_yield();
        const int64_t now = now_ns();
        if (now - looked > OFF_CORE_NS) sign_of_contention(2);
        if (now > until) break;
        looked = now;
    }
    pthread_mutex_lock(&pool.sleep_lock);
    atomic_fetch_add(&pool.sleepers, 1);
    while ((g = atomic_load(&pool.generation)) == seen) pthread_cond_wait(&pool.wake, &pool.sleep_lock);
    atomic_fetch_sub(&pool.sleepers, 1);
    pthread_mutex_unlock(&pool.sleep_lock);
    return g;
}

static uint32_t first_seen[MAX_WORKERS + 1];   /* the generation current when each worker started */

static void *worker(void *arg) {
    const int slot = (int)(intptr_t)arg;
    uint32_t seen = first_seen[slot];
    for (;;) {
        seen = next_generation(seen);
        if (slot <= atomic_load_explicit(&pool.workers, memory_order_relaxed)) take_tasks(seen, slot);
    }
    return NULL;
}

/* workers up to `count`, with every signal blocked: signals stay the caller's to handle */
static void start_workers(int count) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (; pool.started < count; pool.started++) {
        pthread_t thread;
        first_seen[pool.started + 1] = atomic_load(&pool.generation);
        if (pthread_create(&thread, NULL, worker, (void *)(intptr_t)(pool.started + 1)) != 0) break;
        pthread_detach(thread);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* a forked child has none of its parent's threads: it starts its own when it first runs a job */
static void before_fork(void) { pthread_mutex_lock(&pool.run_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&pool.run_lock); }
static void after_fork_child(void) {
    pool.started = 0;
    atomic_store(&pool.sleepers, 0);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_mutex_unlock(&pool.run_lock);
}

static void set_up(void) {
    const char *spin = getenv("SWARM_POOL_SPIN_US");
    pool.spin_ns = (spin ? atoll(spin) : 2000) * 1000LL;
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* a caller that had its core for less than CALLER_SHARE of the time since it last looked was kept off it by
   other threads (or slept: then the pool sleeps a while for nothing) */
static void watch_caller(void) {
    static pthread_t caller;
    static int64_t looked, ran;
    const int64_t now = now_ns();
    if (now - looked < WATCH_NS) return;
    const int64_t cpu = cpu_ns();
    if (pthread_equal(caller, pthread_self()) && (double)(cpu - ran) < CALLER_SHARE * (double)(now - looked))
        sign_of_contention(3);
    caller = pthread_self();
    looked = now;
    ran = cpu;
}

static void run_alone(swarm_task task, void *context, int64_t tasks) {
    for (int64_t i = 0; i < tasks; i++) task(context, i, 0);
}

void swarm_pool_run(swarm_task task, void *context, int64_t tasks, int threads) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, set_up);
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads <= 1 || tasks <= 1 || tasks > MAX_TASKS || pthread_mutex_trylock(&pool.run_lock) != 0) {
        run_alone(task, context, tasks);   /* also a task's own call, or another thread's while one runs */
        return;
    }
    watch_caller();
    start_workers(threads - 1);
    const uint32_t g = (atomic_load_explicit(&pool.generation, memory_order_relaxed) + 1) &
                       ((1u << GENERATION_BITS) - 1);
    atomic_store_explicit(&pool.task, task, memory_order_relaxed);
    atomic_store_explicit(&pool.context, context, memory_order_relaxed);
    atomic_store_explicit(&pool.tasks, tasks, memory_order_relaxed);
    atomic_store_explicit(&pool.workers, threads - 1, memory_order_relaxed);
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.claim, claim_of(g), memory_order_release);
    atomic_store(&pool.generation, g);
    atomic_fetch_add_explicit(&pool.counts[0], 1, memory_order_relaxed);
    if (atomic_load(&pool.sleepers) > 0) {
        atomic_fetch_add_explicit(&pool.counts[1], 1, memory_order_relaxed);
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    take_tasks(g, 0);
    for (int round = 1; atomic_load_explicit(&pool.done, memory_order_acquire) < tasks; round++) {
        cpu_relax();
        if (round % ROUNDS == 0) sched_yield();   /* the task left may be a preempted thread's: let it run */
    }
    pthread_mutex_unlock(&pool.run_lock);
}

/* counts[0..3], since the process started: jobs published to the pool's threads, of them those that found a
   thread asleep, and the signs of contention seen by the pool's threads and by callers */
void swarm_pool_counts(int64_t *counts) {
    for (int i = 0; i < 4; i++) counts[i] = atomic_load(&pool.counts[i]);
}
