/* The tokens a rank's weights count (shares.h): an EP group's tokens this step, and a
 * rank's share of them among the owners of its experts in one expert-data group. */
#include <stdint.h>

#include "shares.h"

#include "layout.h"
#include "rank.h"
#include "run.h"

/* Tokens of EP group g this step. */
uint64_t hx_ep_tokens(const hx_rank *rk, int g)
{
    const hx_group *ep = &rk->run->layout->ep[g];
    uint64_t n = 0;
    for (int i = 0; i < ep->size; i++)
        n += rk->counts[ep->ranks[i]];
    return n;
}

/* The owners of an expert inside one EP group share its N_g tokens: with k owners only the
 * first min(k, N_g) receive rows, and owner i carries an integer share of N_g as its weight
 * in the mean flow (the shares add up to N_g, so the weights of all owners add up to N). */
static uint64_t owner_share(uint64_t ng, int k, int i)
{
    uint64_t active = (uint64_t)k < ng ? (uint64_t)k : ng;
    if ((uint64_t)i >= active)
        return 0;
    return ng / active + ((uint64_t)i < ng % active ? 1 : 0);
}

uint64_t hx_data_share(const hx_rank *rk, int d)
{
    const hx_layout *l = rk->run->layout;
    const hx_group *group = &l->data[d];
    int g = l->ep_of[rk->rank];
    int k = 0, mine = -1;
    for (int i = 0; i < group->size; i++) {
        if (l->ep_of[group->ranks[i]] != g)
            continue;
        if (group->ranks[i] == rk->rank)
            mine = k;
        k++;
    }
    return mine < 0 ? 0 : owner_share(hx_ep_tokens(rk, g), k, mine);
}
