/* clock.h - a monotonic clock for timings and progress. */
#ifndef MX_CLOCK_H
#define MX_CLOCK_H

/* Seconds from a monotonic clock. */
double mx_now(void);

#endif
