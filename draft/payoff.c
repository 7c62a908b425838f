/* payoff.c - measured payoff of n-gram lookups (payoff.h). */
#include "payoff.h"

void tdm_payoff_observe(tdm_payoff *p, tdm_pay_kind k, int32_t committed, double seconds) {
    if (k < 0 || k >= TDM_PAY_KINDS || committed < 0 || !(seconds > 0)) return;
    if (p->n[k] == 0) {
        p->tok[k] = committed;
        p->sec[k] = seconds;
    } else {
        p->tok[k] += TDM_PAYOFF_EMA * (committed - p->tok[k]);
        p->sec[k] += TDM_PAYOFF_EMA * (seconds - p->sec[k]);
    }
    if (p->n[k] < INT32_MAX) p->n[k]++;
}

double tdm_payoff_rate(const tdm_payoff *p, tdm_pay_kind k) {
    if (k < 0 || k >= TDM_PAY_KINDS || p->n[k] < TDM_PAYOFF_MIN || !(p->sec[k] > 0)) return 0;
    return p->tok[k] / p->sec[k];
}

bool tdm_payoff_lookups(tdm_payoff *p) {
    const double look = tdm_payoff_rate(p, TDM_PAY_LOOKUP), model = tdm_payoff_rate(p, TDM_PAY_MODEL);
    if (look <= 0 || model <= 0 || look >= (1.0 - TDM_PAYOFF_MARGIN) * model) {
        p->n_off = 0;
        return true;
    }
    if (++p->n_off >= TDM_PAYOFF_PROBE) {
        p->n_off = 0;
        return true;
    }
    return false;
}

void tdm_payoff_carry(tdm_payoff *dst, const tdm_payoff *pair) {
    *dst = *pair;
    dst->n_off = 0;
    for (int32_t k = 0; k < TDM_PAY_KINDS; k++)
        if (dst->n[k] > TDM_PAYOFF_MIN) dst->n[k] = TDM_PAYOFF_MIN;
}
