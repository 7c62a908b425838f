/* unicode.c - UTF-8 codec, category lookups, GPT-2 byte map. */
#include "unicode.h"

int tdm_utf8_lead_len(uint8_t c) {
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0; /* continuation byte or overlong lead 0xC0/0xC1 */
    if (c < 0xE0) return 2;
    if (c < 0xF0) return 3;
    if (c < 0xF5) return 4;
    return 0;
}

/* Valid range of the second byte for a given lead (rules out overlongs,
 * surrogates and code points above U+10FFFF). */
static void second_byte_range(uint8_t lead, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (lead == 0xE0) *lo = 0xA0;
    else if (lead == 0xED) *hi = 0x9F;
    else if (lead == 0xF0) *lo = 0x90;
    else if (lead == 0xF4) *hi = 0x8F;
}

int tdm_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp) {
    uint8_t c = s[0];
    int n = tdm_utf8_lead_len(c);
    if (n == 1) {
        *cp = c;
        return 1;
    }
    if (n == 0 || (size_t)n > len) goto invalid;
    uint8_t lo, hi;
    second_byte_range(c, &lo, &hi);
    if (s[1] < lo || s[1] > hi) goto invalid;
    for (int i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) goto invalid;
    if (n == 2) *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
    else if (n == 3) *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    else
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
              ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return n;
invalid:
    *cp = TDM_UTF8_INVALID | c;
    return 1;
}

int tdm_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

size_t tdm_utf8_incomplete_tail(const uint8_t *s, size_t len) {
    /* Find the last lead byte within the final 3 bytes. */
    for (size_t k = 1; k <= 3 && k <= len; k++) {
        uint8_t c = s[len - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation: keep looking back */
        int n = tdm_utf8_lead_len(c);
        if (n <= 1 || (size_t)n <= k) return 0; /* ASCII, invalid lead, or complete */
        /* n > k: incomplete if the bytes present are a valid prefix */
        if (k >= 2) {
            uint8_t lo, hi;
            second_byte_range(c, &lo, &hi);
            if (s[len - k + 1] < lo || s[len - k + 1] > hi) return 0;
        }
        return k;
    }
    return 0;
}

uint16_t tdm_unicode_flags(uint32_t cp) {
    if (cp < TDM_UCD_LOW_LIMIT) return tdm_ucd_low[cp];
    if (cp > 0x10FFFF) return 0;
    uint32_t lo = 0, hi = tdm_ucd_n_ranges; /* search [lo, hi) */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (cp > tdm_ucd_ranges[mid].last) lo = mid + 1;
        else if (cp < tdm_ucd_ranges[mid].first) hi = mid;
        else return tdm_ucd_ranges[mid].flags;
    }
    return 0;
}

/* Bytes that map to themselves: '!'..'~', 0xA1..0xAC, 0xAE..0xFF. */
static bool byte_is_self(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t tdm_byte_to_cp(uint8_t b) {
    if (byte_is_self(b)) return b;
    /* the k-th non-self byte (in increasing order) maps to U+0100 + k */
    unsigned k;
    if (b <= 0x20) k = b;                       /* 0x00..0x20: 33 bytes */
    else if (b <= 0xA0) k = 33 + (b - 0x7F);    /* 0x7F..0xA0: 34 bytes */
    else k = 67;                                /* 0xAD */
    return 0x100 + k;
}

int tdm_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_self(cp) ? (int)cp : -1;
    if (cp > 0x100 + 67) return -1;
    unsigned k = cp - 0x100;
    if (k <= 32) return (int)k;
    if (k <= 66) return (int)(0x7F + (k - 33));
    return 0xAD;
}
