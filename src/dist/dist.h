/* dist.h - expert parallelism over MPI: the routed experts of every MoE
 * layer spread over the ranks of an MPI job (docs/distributed.md).
 *
 *   mpirun -np N mlxcel generate|chat|serve|bench|perplexity ...
 *
 * Rank 0 is the program as it runs alone: tokenizer, sampling, the CLI or
 * the server, embeddings, attention, routers, shared experts, dense MLPs,
 * lm_head, and its own share of the routed experts.  Ranks 1..N-1 hold
 * nothing but their share of the routed experts and serve rank 0 from
 * mx_dist_worker() until it ends the job.  Every MoE block of a forward
 * pass goes through the model's remote hook (model.h, mx_moe_remote):
 *
 *   rank 0                                   rank r > 0
 *   route every token (as alone)
 *   each token's x and the experts r owns  ->  run them through the same
 *                                              path (fused for one token,
 *                                              gather for several)
 *   run its own share (and the extras)
 *   <- every (token, expert) output unweighted
 *   sum each token's experts in route order, then the extras,
 *   exactly as one process sums them
 *
 * so the logits do not depend on N: they are the single process's bit for
 * bit (the same kernel variant and precision everywhere: rank 0 sends its
 * own with every job).  A prompt or a batched decode step is one exchange
 * per MoE layer for all its tokens.
 *
 * Which rank holds which expert is the plan: contiguous runs of each
 * layer's experts, balanced by bytes with what rank 0 holds besides, or an
 * expert map file (mx_dist_plan_make).  Each rank maps only the tensors it
 * binds (a lazily opened checkpoint), so its address space and resident
 * set are its share.
 *
 * Without MPI at build time, or when the program was not started by an MPI
 * launcher, everything here answers "one process" and nothing changes. */
#ifndef MX_DIST_H
#define MX_DIST_H

#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "util/err.h"

/* ---- the process ------------------------------------------------------------ */

/* Takes the options that belong here out of argv (--expert-map FILE,
 * anywhere after the command) and, when an MPI launcher started this
 * process, starts MPI.  With more than one rank, rank 0's mx_model_load
 * becomes the distributed loader (mx_model_set_loader) and mx_dist_finalize
 * runs at exit.  Fails on a malformed option or when MPI cannot give the
 * thread support the exchange needs. */
int mx_dist_init(int *argc, char ***argv, mx_err *e);
int mx_dist_rank(void);
int mx_dist_size(void);   /* 1 when not distributed */
/* The --expert-map FILE taken from the command line, or NULL. */
const char *mx_dist_expert_map(void);

/* The life of ranks 1..N-1: load the share rank 0 asks for, run the jobs it
 * sends, until it ends the job.  Returns the process's exit status. */
int mx_dist_worker(void);

/* Rank 0: ends the job (the other ranks leave mx_dist_worker), then MPI.
 * exit_code nonzero tells them the job failed.  Safe to call twice. */
void mx_dist_finalize(int exit_code);

/* ---- the plan: which rank holds which routed expert ----------------------- */

typedef struct mx_dist_plan {
    int n_ranks, n_layers, n_experts;
    int16_t *owner;        /* [n_layers][n_experts]: the rank running it (-1: no such expert) */
    uint64_t *bytes;       /* [n_ranks] weight bytes each rank holds */
    uint64_t base_bytes;   /* of which rank 0 holds besides routed experts */
    char source[256];      /* "balanced by bytes" or the map file */
} mx_dist_plan;

/* The plan for n_ranks ranks of model m (its experts sized; they need not
 * be bound): with map_file NULL, each MoE layer's experts in contiguous
 * runs, rank 0 first, sized so the ranks' weight bytes (rank 0's including
 * everything but routed experts) are as even as whole experts allow; else
 * the map file's assignment:
 *     # comments
 *     LAYER: RANK RANK ...     the rank of each expert of MoE layer LAYER
 *     *: RANK RANK ...         every MoE layer not listed
 * Errors name the file, line and field. */
int mx_dist_plan_make(const mx_model *m, int n_ranks, const char *map_file, mx_dist_plan *p,
                      mx_err *e);
void mx_dist_plan_free(mx_dist_plan *p);
/* The plan in a few lines: each rank's experts (runs per layer) and bytes. */
void mx_dist_plan_print(const mx_dist_plan *p, FILE *f);

/* ---- statistics ----------------------------------------------------------- */

/* What a rank did since the last reset.  Rank 0's comm counts the exchange
 * (packing, sending, waiting for the other ranks' outputs, summing);
 * compute its own share of the experts; other ranks' idle is time spent
 * waiting for rank 0. */
typedef struct mx_dist_stats {
    double t_compute, t_comm, t_idle;   /* seconds */
    uint64_t expert_bytes;              /* weights of the routed experts it ran (each once per job) */
    long jobs;                          /* MoE blocks it took part in */
    uint64_t sent, received;            /* message bytes */
    uint64_t peak_rss;                  /* the process's peak resident set (not reset) */
} mx_dist_stats;

/* Rank 0: every rank's statistics into per_rank[mx_dist_size()]. */
int mx_dist_stats_get(mx_dist_stats *per_rank, mx_err *e);
/* Rank 0: starts every rank's statistics over. */
void mx_dist_stats_reset(void);

#endif
