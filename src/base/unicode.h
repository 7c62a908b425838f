/* unicode.h - UTF-8 decoding/encoding and code point category lookups.
 *
 * Categories come from the generated range table in unicode_data.c
 * (tools/gen_unicode.py, Python's unicodedata).  Also the GPT-2 byte <-> code point
 * map used by byte-level BPE vocabularies.
 */
#ifndef TDM_UNICODE_H
#define TDM_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Category flags (see tools/gen_unicode.py). */
enum {
    TDM_UCD_LETTER = 1 << 0,     /* L*  (\p{L}) */
    TDM_UCD_NUMBER = 1 << 1,     /* N*  (\p{N}) */
    TDM_UCD_WHITESPACE = 1 << 2, /* White_Space (\s) */
    TDM_UCD_MARK = 1 << 3,       /* M* */
    TDM_UCD_PUNCT = 1 << 4,      /* P* */
    TDM_UCD_SYMBOL = 1 << 5,     /* S* */
    TDM_UCD_CONTROL = 1 << 6,    /* Cc */
    TDM_UCD_ASSIGNED = 1 << 7,   /* not Cn */
    TDM_UCD_UPPER = 1 << 8,      /* Lu, Lt (\p{Lu}\p{Lt}) */
    TDM_UCD_LOWER = 1 << 9,      /* Ll (\p{Ll}); a letter with neither is Lm or Lo */
    TDM_UCD_DIGIT = 1 << 10,     /* Nd (\d) */
};

typedef struct tdm_ucd_range {
    uint32_t first, last; /* inclusive code point range */
    uint16_t flags;
} tdm_ucd_range;

extern const tdm_ucd_range tdm_ucd_ranges[];
extern const uint32_t tdm_ucd_n_ranges;
/* The flags of the code points below TDM_UCD_LOW_LIMIT, indexed directly. */
#define TDM_UCD_LOW_LIMIT 0x800
extern const uint16_t tdm_ucd_low[TDM_UCD_LOW_LIMIT];
extern const char tdm_unicode_version[];

/* A decoded position that is not valid UTF-8: one raw byte, reported as this
 * value | byte (never a real code point; its flags are 0). */
#define TDM_UTF8_INVALID 0x80000000u

/* Decodes one code point from s[0..len) (len >= 1).  Returns the bytes consumed
 * (1..4).  Invalid input (bad lead byte, truncated or bad continuation, overlong
 * form, surrogate, > U+10FFFF) consumes exactly one byte and sets
 * *cp = TDM_UTF8_INVALID | byte. */
int tdm_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp);

/* Encodes a code point (<= 0x10FFFF) into out; returns 1..4 (0 if cp is invalid). */
int tdm_utf8_encode(uint32_t cp, char out[4]);

/* Length of the sequence a lead byte announces (1..4), 0 for a byte that cannot
 * start a sequence (continuation byte, 0xC0/0xC1, 0xF5..0xFF). */
int tdm_utf8_lead_len(uint8_t lead);

/* For streaming: the number of bytes at the end of s[0..len) that form an
 * incomplete but still possibly valid sequence (0..3). */
size_t tdm_utf8_incomplete_tail(const uint8_t *s, size_t len);

/* Category flags of a code point (0 for TDM_UTF8_INVALID values). */
uint16_t tdm_unicode_flags(uint32_t cp);

static inline bool tdm_unicode_is_letter(uint32_t cp) { return tdm_unicode_flags(cp) & TDM_UCD_LETTER; }
static inline bool tdm_unicode_is_number(uint32_t cp) { return tdm_unicode_flags(cp) & TDM_UCD_NUMBER; }
static inline bool tdm_unicode_is_space(uint32_t cp) { return tdm_unicode_flags(cp) & TDM_UCD_WHITESPACE; }

/* GPT-2 byte-level map: every byte value has a printable code point
 * (printable Latin-1 bytes map to themselves, the rest to U+0100.. in order). */
uint32_t tdm_byte_to_cp(uint8_t b);
/* Inverse; -1 when cp is not in the image of the map. */
int tdm_cp_to_byte(uint32_t cp);

#endif
