/* weight_view.c - views of part of a weight matrix (backend.h). */
#include "backend.h"

bool tdm_weight_rows_view(const tdm_weight *w, int64_t r0, int64_t nr, tdm_weight *v) {
    if (w->layout == TDM_LAYOUT_P64 && (r0 % TDM_LAYOUT_P64_ROWS || nr % TDM_LAYOUT_P64_ROWS)) return false;
    if (w->layout != TDM_LAYOUT_P64 && w->layout != TDM_LAYOUT_ROWS) return false;
    if (r0 < 0 || nr <= 0 || r0 > w->rows - nr) return false;
    *v = *w;
    v->rows = nr;
    v->data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes; /* (P64: r0 / 64 blocks) */
    if (w->scale) v->scale = w->scale + r0;
    return true;
}

bool tdm_weight_cols_view(const tdm_weight *w, int64_t c0, int64_t nc, tdm_weight *v) {
    if (c0 < 0 || nc <= 0 || c0 > w->cols - nc) return false;
    size_t off;
    if (w->layout == TDM_LAYOUT_P64) {
        uint64_t eb;
        if (tdm_dtype_block_elems(w->type) != 1 || !tdm_dtype_row_bytes(w->type, 1, &eb)) return false;
        off = (size_t)c0 * TDM_LAYOUT_P64_ROWS * (size_t)eb;
    } else if (w->layout == TDM_LAYOUT_ROWS) {
        uint32_t be = tdm_dtype_block_elems(w->type);
        if (be == 0 || c0 % be || nc % be) return false;
        off = (size_t)(c0 / be) * tdm_dtype_block_bytes(w->type);
    } else {
        return false;
    }
    *v = *w;
    v->cols = nc;
    v->data = (const uint8_t *)w->data + off;
    return true;
}
