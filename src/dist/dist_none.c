/* dist_none.c - dist.h in a build without MPI: one process, always. */
#include <string.h>

#include "dist/dist.h"
#include "dist/dist_int.h"

static const char *g_map;

int mx_dist_init(int *argc, char ***argv, mx_err *e)
{
    return mx_dist_take_options(argc, *argv, &g_map, e);
}

int mx_dist_rank(void) { return 0; }
int mx_dist_size(void) { return 1; }
const char *mx_dist_expert_map(void) { return g_map; }
int mx_dist_worker(void) { return 1; }
void mx_dist_finalize(int exit_code) { (void)exit_code; }

int mx_dist_stats_get(mx_dist_stats *per_rank, mx_err *e)
{
    memset(per_rank, 0, sizeof *per_rank);
    return MX_OK;
}

void mx_dist_stats_reset(void) {}
