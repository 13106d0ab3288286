// pool.h: the CPU's worker threads: one parallel loop at a time over a range, split between every core.
// The CPU reference forward pass (cpu.c) and the GPU engine's CPU share (cpu_matvec) run on it.
#ifndef DJINN_POOL_H
#define DJINN_POOL_H

#include <stdint.h>

// fn(ctx, begin, end) computes [begin, end) of a range.
// Every call below works on the calling thread's pool: the process's, or one it chose with cpu_pool_use.
typedef void (*cpu_task_fn)(void *ctx, int64_t begin, int64_t end);

// Runs fn over [0, n), split into one contiguous part per thread (the caller takes part 0); inline when the work
// (`cost`, roughly flops) is too small to be worth waking threads. Calls are serialised.
void cpu_parallel_for(int64_t n, double cost, cpu_task_fn fn, void *ctx);
// cpu_parallel_for in two halves: start hands the workers their parts and returns at once; join runs the
// caller's part 0 and returns when every part is done. In between, the caller may do other work but must not call
// the pool again (the calls are serialised: it would wait for itself).
void cpu_parallel_start(int64_t n, cpu_task_fn fn, void *ctx);
void cpu_parallel_join(void);
// Worker threads (a pool started on first use). cpu_set_threads only has an effect before that; n <= 0: one per
// CPU of the process's affinity mask. cpu_threads starts the pool and returns its size (caller included).
void cpu_set_threads(int n);
int cpu_threads(void);
int cpu_threads_planned(void);  // the size cpu_threads will give, without starting the pool
// Joins the workers (at exit: a pool left running holds their stacks); a later call starts a new pool.
void cpu_pool_stop(void);
// Pools of their own, for threads whose CPU work runs beside another's (the GPU engines of a tensor-parallel run:
// tp_engine.c): `threads` workers with the caller, started on first use. cpu_pool_use(p) makes p the calling
// thread's pool (NULL: the process's again); a pool is freed after no thread uses it.
typedef struct cpu_pool cpu_pool;
cpu_pool *cpu_pool_new(int threads);  // NULL: out of memory
void cpu_pool_free(cpu_pool *p);
void cpu_pool_use(cpu_pool *p);
// cpu.c's asynchronous job holds its pool from start to finish (one job at a time a pool).
void cpu_pool_hold(void);
void cpu_pool_unhold(void);
// Test-only: how many workers are asleep now, waiting for the next call (not spinning).
int cpu_pool_asleep(void);

#endif
