/* The tokens a rank's weights count (shares.c). */
#ifndef HX_SHARES_H
#define HX_SHARES_H

#include <stdint.h>

typedef struct hx_rank hx_rank;

/* Tokens of EP group g this step (every member's count). */
uint64_t hx_ep_tokens(const hx_rank *rk, int g);

/* Rank rk's share of its EP group's tokens in expert-data group d this step: the weight it
 * reduces with in the mean flow; 0 when it serves no row. */
uint64_t hx_data_share(const hx_rank *rk, int d);

#endif
