#!/usr/bin/env python3
"""Independent check of DeepSeek-V4.1's compressed token map (the reference's
inference/engram.py build_compressed_token_map), in plain Python: tokenizer.json read with json,
byte-level BPE single-token decode, Python's unicodedata for the normalisers. No tokenizers
package and no C code: tests/unit/test_engram_hash.c compares the C map (utf8proc) with this.

usage: engram_token_map.py TOKENIZER_JSON [N_TOK]
prints: line 1 "n_tok <n> compressed <m> unicode <unidata_version>", then one compressed id per
token id, one per line.

The normaliser sequence, as the Rust `tokenizers` crate applies it:
  NFKC, NFD, StripAccents (drop general category M: Mn, Mc, Me, the unicode-normalization crate's
  is_combining_mark), Lowercase (char by char: Rust's
  char::to_lowercase, so no final-sigma rule, unlike str.lower), [ \\t\\r\\n]+ -> " ",
  "^ $" -> U+E000, Strip (Rust's char::is_whitespace = the White_Space property, which is not
  Python's str.isspace: no U+001C..U+001F), U+E000 -> " ".
A decoded text containing U+FFFD (after from_utf8_lossy) is keyed by the raw token string.
"""
import json
import re
import sys
import unicodedata

# Unicode's White_Space property (PropList.txt), which Rust's char::is_whitespace tests.
WHITE_SPACE = set([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029,
                   0x202F, 0x205F, 0x3000] + list(range(0x2000, 0x200B)))


def bytes_to_unicode():
    """GPT-2's byte <-> printable character table of the ByteLevel pre-tokenizer/decoder."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


CHAR_BYTES = bytes_to_unicode()


def decode_one(piece):
    """ByteLevel decoder on one token: its chars back to bytes when every char is in the table,
    else the token's own UTF-8; then from_utf8_lossy."""
    if all(c in CHAR_BYTES for c in piece):
        raw = bytes(CHAR_BYTES[c] for c in piece)
    else:
        raw = piece.encode("utf-8")
    return raw.decode("utf-8", errors="replace")


def rust_lower(s):
    out = []
    for c in s:
        lo = c.lower()  # per char: Python's full lowercase of one char = Rust's char::to_lowercase
        out.append(lo)
    return "".join(out)


def normalize(text):
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if not unicodedata.category(c).startswith("M"))
    s = rust_lower(s)
    s = re.sub(r"[ \t\r\n]+", " ", s)
    if s == " ":
        s = "\ue000"
    b, e = 0, len(s)
    while b < e and ord(s[b]) in WHITE_SPACE:
        b += 1
    while e > b and ord(s[e - 1]) in WHITE_SPACE:
        e -= 1
    s = s[b:e]
    return s.replace("\ue000", " ")


def main():
    tok = json.load(open(sys.argv[1], encoding="utf-8"))
    pieces = {}
    for p, i in tok["model"]["vocab"].items():
        pieces[i] = p
    for a in tok.get("added_tokens", []):
        pieces[a["id"]] = a["content"]
    n_tok = max(pieces) + 1
    if len(sys.argv) > 2:
        n_tok = int(sys.argv[2])
    key_to_new = {}
    out = []
    for i in range(n_tok):
        piece = pieces.get(i, "")
        text = decode_one(piece)
        if "\ufffd" in text:
            key = piece
        else:
            norm = normalize(text)
            key = norm if norm else text
        out.append(key_to_new.setdefault(key, len(key_to_new)))
    print("n_tok %d compressed %d unicode %s" % (n_tok, len(key_to_new), unicodedata.unidata_version))
    sys.stdout.write("".join("%d\n" % v for v in out))


if __name__ == "__main__":
    main()
