#!/usr/bin/env python3
"""gen.py - the reference splits and token ids the pre-tokenizer tests compare with.

Usage (from the repository root; needs the `regex`, `tokenizers` and `sentencepiece`
packages):
    python3 -m venv /tmp/venv-tok
    /tmp/venv-tok/bin/pip install regex tokenizers sentencepiece protobuf
    /tmp/venv-tok/bin/python tests/data/pretok/gen.py

Writes, next to this script:
  splits.jsonl  one line per (pre-tokenizer, text): {"pre": NAME, "text" or "hex": the
                input (hex when it is not valid UTF-8), "ends": the byte offset where
                each piece ends}.  NAME is a tokenizer.ggml.pre name.
  ids.jsonl     one line per (pre-tokenizer, text): {"pre", "text", "ids"}: the token
                ids Hugging Face tokenizers gives with the GPT-2 vocabulary of
                tests/data/vocab/ggml-vocab-gpt-2.gguf (its merges, its <|endoftext|>)
                under that pre-tokenizer; "parse_special": false where the text's
                "<|endoftext|>" is plain text (HF's encode_special_tokens).
  spm.jsonl     one line per (variant, text): {"add_space_prefix", "user_defined",
                "text", "ids"}: the ids the sentencepiece library gives with the
                vocabulary of tests/data/vocab/ggml-vocab-llama-spm.gguf (pieces,
                scores, types; BPE with byte fallback) as a model proto, with and
                without the dummy prefix (Gemma's vocabularies have none), and with
                some pieces made user-defined (Gemma's have many).

Each pre-tokenizer is its list of regexes, each applied as a Split(pattern,
behavior="isolated") step: the patterns of the models' tokenizer.json files (the
original forms, with (?i:...) where llama.cpp spells the cases out), and llama.cpp's
own lists where there is no such file ("default", "falcon").  Splits of valid UTF-8
come from Hugging Face tokenizers' pre_tokenize_str; the same splits computed with
Python's regex module (an independent engine) must agree, or this script stops.
Text that is not valid UTF-8 goes through the regex module only, each invalid byte
read as U+FFFD (what llama.cpp's decoder puts there; Hugging Face cannot take such
text).
"""
import json
import os
import struct
import sys

import regex
import sentencepiece
from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))

C = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
GPT2_NO_S = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = C + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SEED_CODER = C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
BAILINGMOE = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"
              r"|\s+(?!\S)|\s+")
MINICPM5 = C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
UP = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
LOW = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
GPT4O = (r"[^\r\n\p{L}\p{N}]?" + UP + "*" + LOW + "+" + C + "?|[^\\r\\n\\p{L}\\p{N}]?" + UP + "+" + LOW + "*" + C +
         r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?" + UP + "*" + LOW + "+|[^\\r\\n\\p{L}\\p{N}]?" + UP + "+" + LOW +
          r"*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek LLM's cased-letter class, its ranges as llama-vocab.cpp's pattern lists them
DEEPSEEK_LATIN_RANGES = [
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
]
DEEPSEEK_LATIN = "[" + "".join(chr(a) + "-" + chr(b) for a, b in DEEPSEEK_LATIN_RANGES) + "]"
DEEPSEEK_CJK = "[一-龥ࠀ-一가-\ud7ff]+"
BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"

# tokenizer.ggml.pre name -> its regexes, in order
PRES = {
    "gpt-2": [GPT2],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2_NO_S, r"\p{N}+", "[0-9][0-9][0-9]"],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2_NO_S, "[0-9][0-9][0-9]"],
    "starcoder": [r"\p{N}", GPT2_NO_S],
    "llama-bpe": [LLAMA3],
    "minicpm5": [r"\p{N}{1,3}", MINICPM5],
    "qwen2": [QWEN2],
    "bailingmoe": [BAILINGMOE],
    "qwen35": [QWEN35],
    "seed-coder": [SEED_CODER],
    "ufakzeka": [UFAKZEKA],
    "laguna": [r"[^\n]+|[\n]+", QWEN2],
    "gpt-4o": [GPT4O],
    "tekken": [TEKKEN],
    "deepseek-llm": ["[\r\n]", r"\s?" + DEEPSEEK_LATIN + "+", r"\s?[!-/:-~！-／：-～‘-‟\u3000-。]+", r"\s+$",
                     DEEPSEEK_CJK, r"\p{N}+"],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"],
    "deepseek-v3": [r"\p{N}{1,3}", "[一-龥\u3040-ゟ゠-ヿ]+",
                    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "bloom": [BLOOM],
    "viking": [BLOOM, r"\p{N}"],
    "superbpe": [r"\p{N}+", r"(?=(\d{3})+(?!\d))"],
}

# the ones tested with whole tokenizations (the GPT-2 vocabulary), and whether
# llama.cpp skips the merges for a pre-token in the vocabulary under that name
IDS = {"gpt-2": False, "default": False, "falcon": False, "starcoder": False, "llama-bpe": True,
       "qwen2": False, "qwen35": False, "gpt-4o": False, "tekken": True, "deepseek-llm": False,
       "deepseek-coder": False, "deepseek-v3": False, "bloom": False, "superbpe": False}

TEXTS = [
    # whitespace runs, newlines, tabs
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \r\n", "\r\n\r\n", "a\r\nb", "\t\t", " \t", "\t ",
    "a  b", "a   b", "a \tb", "  a", "a  ", "a \n", " \n \n", "x\n\n\ny", "x \n y", "a\n  b", "a \n\n  b",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n", "    Hello\n    Hello", "x\t\t\ty", "a\x0b\x0cb",
    "a\x85b", "a\u1680b", "a\u2028b", "a\u3000b", "a\u3000\u3000!", "\u00a0nbsp", "a \u00a0b", "end  ",
    # digits
    "1", "12", "123", "1234", "12345", "1234567", " 1", " 12345", "a1b2", "3.14159", "1,000,000",
    "x=12345+678", "\u0663\u0664\u0665\u0666", "\u00b2\u00b3\u00bd", "\u216b", "\uff11\uff12\uff13\uff14",
    "ied 4 \u00bd months", "w048 7tuijk", "v1.2.3-rc4", "0x1F", "12345678901234567890",
    # contractions
    "I'm", "you're", "he's", "we've", "they'll", "I'd", "don't", "IT'S", "YOU'RE", "WE'VE", "THEY'LL",
    "I'D", "DON'T", "'s", "''s", "it's'", "'\u017f", "a'\u017f", "O'Neil", "'re'", "'ll've", "' era",
    "Hello, y'all!", "rock'n'roll", "x'S'T",
    # letter case (o200k)
    "HelloWorld", "HTMLParser", "camelCase", "ABC", "aBC", "ABCdef", "\u00c9clair", "\u00e9CLAIR",
    "\u01c5ungla", "\u02b0ello", "\u0391\u0392\u0393\u03b1\u03b2\u03b3", "\u0130stanbul", "McDONALD's",
    "iPhone", "XMLHttpRequest", "snake_case_name", "Ab\u65e5\u672c",
    # scripts, marks, symbols
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4e2d\u6587\u5b57\u7b26\u4e32\u6d4b\u8bd5",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0939\u093f\u0928\u094d\u0926\u0940", "e\u0301t\u00e9", "\u0301abc", " \u0301", "!\u0301", "!!\u0301",
    "a \u0301b", "\u00d1and\u00fa", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u05e9\u05dc\u05d5\u05dd",
    "\u0e44\u0e17\u0e22 \u0e20\u0e32\u0e29\u0e32", "C\u1eeda Vi\u1ec7t", "F\u00fchrer",
    "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438",
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2", "\U0001f642", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "\U0001f1fa\U0001f1f8", "a\U0001f642b", " \U0001f642 ", "\u200b", "\ufeffBOM", "\u3053\u3093\u306b\u3061\u306f",
    "\u30ab\u30bf\u30ab\u30ca\u30fc", "\uac00\u00e9",
    "\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 (only emoji)",
    # punctuation and code
    "Hello, world!", " Hello World!", "...", "!!!", "!!!!!!", " (", "\n =", "x = a + b * (c - d) / e;",
    "def f(x):\n    return x ** 2\n", "\t\tdef f(x):\n\t\treturn x\n", "if (a >= b && c != d) { return; }",
    "https://example.com/path?q=1&r=2", "a/b//c", "!/\n/", "x!\n\ny", "C++ #include <stdio.h>",
    "$100 ^ ~x | y", "`code`", "\u00abquotes\u00bb \u201ccurly\u201d \u2018single\u2019",
    "\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c", "\uff08\u5168\u89d2\uff09\uff01\uff1f", "\u2014dash\u2014",
    "a.b,c!d?e(f)g|h", "\u00ab\u00bb\u2014\u2013", "#!/usr/bin/env python3", "@decorator\n", "{'k': [1, 2]}",
    # mixed
    "Hello world! I'm testing 12345 tokens: \u65e5\u672c\u8a9e, \u00e9moji \U0001f642, and\ttabs\n\nnew lines.",
    "\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e", " this is \U0001f999.cpp",
    "3333333 tokens\r\nOK", "<|endoftext|>", "a<|endoftext|>b",
]

INVALID = ["ff", "c0 80", "e2 82", "e2 82 61", "ed a0 80", "f0 9f 98", "61 80 62", "20 ff 20 41", "c3", "27 ff",
           "31 ff 32", "27 73 ff", "ff 41 42", "e6 97 a5 e6 97"]


def utf8_ends(text, char_ends):
    """Byte offsets of code point offsets."""
    out, k, b = [], 0, 0
    pos = [0]
    for ch in text:
        b += len(ch.encode("utf-8"))
        pos.append(b)
    for e in char_ends:
        out.append(pos[e])
    return out


def regex_split(patterns, text):
    """Pieces (as code point end offsets) of text under the patterns, each an
    isolated split of every piece."""
    pieces = [(0, len(text))]
    for p in patterns:
        rx = regex.compile(p)
        nxt = []
        for a, b in pieces:
            s, prev = text[a:b], 0
            for m in rx.finditer(s):
                if m.start() > prev:
                    nxt.append((a + prev, a + m.start()))
                if m.end() > m.start():
                    nxt.append((a + m.start(), a + m.end()))
                prev = m.end()
            if prev < len(s):
                nxt.append((a + prev, b))
        pieces = nxt
    return [b for _, b in pieces]


def hf_pre(patterns):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns])


def hf_split(pre, text):
    return [e for _, (_, e) in pre.pre_tokenize_str(text)]


def read_gguf_meta(path):
    """The metadata of a GGUF file (values of the types a vocabulary uses)."""
    b = open(path, "rb").read()
    pos = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", b, pos)
    pos += 16
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        nonlocal pos
        if t == 8:
            n, = struct.unpack_from("<Q", b, pos)
            pos += 8 + n
            return b[pos - n:pos]
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, pos)
            pos += 12
            if et in scalar:
                v = list(struct.unpack_from("<%d%s" % (n, scalar[et]), b, pos))
                pos += struct.calcsize(scalar[et]) * n
                return v
            return [value(et) for _ in range(n)]
        v, = struct.unpack_from("<" + scalar[t], b, pos)
        pos += struct.calcsize(scalar[t])
        return v

    kv = {}
    for _ in range(n_kv):
        n, = struct.unpack_from("<Q", b, pos)
        key = b[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        t, = struct.unpack_from("<I", b, pos)
        pos += 4
        kv[key] = value(t)
    return kv


def gpt2_tokenizer(patterns, ignore_merges):
    kv = read_gguf_meta(os.path.join(ROOT, "tests", "data", "vocab", "ggml-vocab-gpt-2.gguf"))
    toks = [t.decode("utf-8") for t in kv["tokenizer.ggml.tokens"]]
    merges = [tuple(m.decode("utf-8").split(" ", 1)) for m in kv["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=merges,
                               ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([hf_pre(patterns),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    specials = [toks[i] for i, ty in enumerate(kv["tokenizer.ggml.token_type"]) if ty == 3]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


# pieces of the llama-spm vocabulary made user-defined in the Gemma-like variant
SPM_USER_DEFINED = ["ing", "://", "()", "==", "Hello"]


def spm_processor(add_prefix, user_defined):
    kv = read_gguf_meta(os.path.join(ROOT, "tests", "data", "vocab", "ggml-vocab-llama-spm.gguf"))
    m = sentencepiece_model_pb2.ModelProto()
    for text, score, ty in zip(kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.scores"],
                               kv["tokenizer.ggml.token_type"]):
        p = m.pieces.add()
        p.piece = text.decode("utf-8")
        p.score = score
        p.type = 4 if p.piece in user_defined else ty  # the GGUF token types are sentencepiece's
    m.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 0, 1, 2, -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = add_prefix
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


def main():
    texts = list(TEXTS)
    for line in open(os.path.join(ROOT, "tests", "data", "vocab", "gpt-2.jsonl"), encoding="utf-8"):
        t = json.loads(line)["text"]
        if t not in texts:
            texts.append(t)
    n_splits = 0
    with open(os.path.join(HERE, "splits.jsonl"), "w", encoding="utf-8") as out:
        for name, patterns in PRES.items():
            pre = hf_pre(patterns)
            for text in texts:
                ref = hf_split(pre, text)
                alt = regex_split(patterns, text)
                if ref != alt:
                    sys.exit("%s: %r: tokenizers %s, regex %s" % (name, text, ref, alt))
                out.write(json.dumps({"pre": name, "text": text, "ends": utf8_ends(text, ref)},
                                     ensure_ascii=False) + "\n")
                n_splits += 1
            for h in INVALID:
                raw = bytes.fromhex(h)
                # each byte that is not valid UTF-8 read as U+FFFD, one code point per byte
                dec = raw.decode("utf-8", "surrogateescape")
                text = "".join("\ufffd" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in dec)
                blen = [1 if 0xDC80 <= ord(c) <= 0xDCFF else len(c.encode()) for c in dec]
                cum = [0]
                for n in blen:
                    cum.append(cum[-1] + n)
                ends = [cum[e] for e in regex_split(patterns, text)]
                out.write(json.dumps({"pre": name, "hex": h.replace(" ", ""), "ends": ends}) + "\n")
                n_splits += 1
    n_ids = 0
    with open(os.path.join(HERE, "ids.jsonl"), "w", encoding="utf-8") as out:
        for name, ignore in IDS.items():
            tok = gpt2_tokenizer(PRES[name], ignore)
            for text in texts:
                ids = tok.encode(text, add_special_tokens=False).ids
                out.write(json.dumps({"pre": name, "text": text, "ids": ids}, ensure_ascii=False) + "\n")
                n_ids += 1
            tok.encode_special_tokens = True
            for text in texts:
                if "<|endoftext|>" in text:
                    ids = tok.encode(text, add_special_tokens=False).ids
                    out.write(json.dumps({"pre": name, "text": text, "parse_special": False, "ids": ids},
                                         ensure_ascii=False) + "\n")
                    n_ids += 1
    n_spm = 0
    with open(os.path.join(HERE, "spm.jsonl"), "w", encoding="utf-8") as out:
        for prefix, user in ((True, []), (False, []), (False, SPM_USER_DEFINED)):
            sp = spm_processor(prefix, user)
            for text in texts:
                out.write(json.dumps({"add_space_prefix": prefix, "user_defined": user, "text": text,
                                      "ids": sp.encode(text)}, ensure_ascii=False) + "\n")
                n_spm += 1
    print("splits.jsonl: %d lines (%d pre-tokenizers), ids.jsonl: %d lines (%d), spm.jsonl: %d lines" %
          (n_splits, len(PRES), n_ids, len(IDS), n_spm))


if __name__ == "__main__":
    main()
