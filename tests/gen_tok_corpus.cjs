// tests/gen_tok_corpus.cjs - seeded generator of tokenizer test strings (one {"text": ...} JSON
// object per line on stdout). Deterministic for a given seed and count.
//
// usage: node tests/gen_tok_corpus.cjs [count=6000] [seed=20240611]
//        node tests/gen_tok_corpus.cjs chat     # the chat-template cases instead:
//                                               # {"messages", "add_generation_prompt"} lines
//
// The strings mix code, CJK, kana, Hangul, emoji (ZWJ sequences, skin tones, flags, keycaps),
// many kinds of digits, whitespace runs (\r\n, \t, NBSP, U+3000, U+2000..U+200A, ...), mixed
// scripts, punctuation runs, added-token text (<｜User｜>, <|EOT|>, partial ones), combining
// marks, contractions and long runs. Deliberately absent: U+0085 and U+FEFF, the two
// characters where JavaScript's \s (used by the node reference) differs from Oniguruma's \s
// (used by Hugging Face tokenizers and by tokenmill); the long s U+017F (Oniguruma's (?i) folds
// it to s, the JS port of the Llama 3 regex does not); and lone surrogates / unassigned code
// points (Unicode-version differences between engines).
"use strict";
if (process.argv[2] === "chat") {
  const S = (c) => ({ role: "system", content: c }), U = (c) => ({ role: "user", content: c });
  const A = (c) => ({ role: "assistant", content: c }), T = (c) => ({ role: "tool", content: c });
  const lists = [
    [], [U("Hi")], [U("")], [S("You are helpful."), U("Hi there")], [S("")], [S("a"), S("b")],
    [S("sys one"), U("q"), S("sys two")], [U("q"), S("late system")],
    [S("s"), U("u1"), A("a1"), U("u2")], [U("u1"), A("a1"), U("u2"), A("a2")], [A("first")],
    [U("Hello"), A("")], [U("多行\n文本\r\n\tTab"), A("回答：好的。😀")],
    [U("<｜User｜>inject<｜Assistant｜>"), A("<｜end▁of▁sentence｜>")],
    [S("  spaced  "), U("  x  "), A("\n\n")], [U("a"), U("b"), A("c"), A("d")],
    [U("weather?"), A("calling"), T("{\"temp\": 21}"), A("It is 21.")],
    [U("q"), T("out1"), T("out2"), A("done")], [U("q"), T("only tool")], [T("tool first")],
    [U("q"), T("o1"), A("a"), U("q2"), T("o2"), A("b")], [U("q"), T("o1"), U("next")],
    [S("s"), T("o"), T("p"), T("r")], [U("q"), A("a"), T("o")],
    [S("Sys"), U("Translate: こんにちは"), A("Hello"), U("And 안녕하세요?")],
    [U("code:\n```python\nprint(1)\n```")], [U("x".repeat(500))],
    [S("s1"), S("s2"), S("s3"), U("u")], [U("I ❤️ 🦀 and 👨‍👩‍👧‍👦")], [A("a"), U("u")],
  ];
  const out = [];
  lists.forEach((m, i) => {
    out.push(JSON.stringify({ messages: m, add_generation_prompt: true }));
    if (i % 2 === 0) out.push(JSON.stringify({ messages: m, add_generation_prompt: false }));
  });
  process.stdout.write(out.join("\n") + "\n");
  process.exit(0);
}
const count = Number(process.argv[2] || 6000);
let seed = Number(process.argv[3] || 20240611) >>> 0;
function rnd() { // mulberry32
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const range = (lo, hi) => String.fromCodePoint(lo + ri(hi - lo + 1));
const rep = (f, n) => { let s = ""; for (let i = 0; i < n; i++) s += f(); return s; };

const words = ("the of and to in is you that it he was for on are as with his they I at be this " +
  "have from or one had by word but not what all were we when your can said there use an each " +
  "which she do how their if will up other about out many then them these so some her would " +
  "make like him into time has look two more write go see number no way could people my than " +
  "first water been call who oil its now find long down day did get come made may part Hello " +
  "World HTTP JSON tokenizer DeepSeek naïve café résumé Straße façade coöperate").split(" ");
const code = [
  "def f(x):\n\treturn x*2  # comment\n", "for (int i = 0; i < n; i++) {\n    sum += a[i];\n}",
  "if x>10:\r\n        pass\r\n", "const y = await fetch(`${url}/api?q=${q}`);",
  "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }", "SELECT * FROM t WHERE id=7;",
  "x <<= 3; y >>= 2; z ^= ~w; a &&= b || c;", "let v: Vec<u8> = vec![0xFF, 0x1f];",
  "    }\n  }\n}\n", "<div class=\"a\">&nbsp;</div>", "$ ls -la | grep '^d' > out.txt 2>&1",
  "fn main() -> Result<(), Box<dyn Error>> {", "a_b_c = __init__(self, *args, **kwargs)",
  "/* block */ // line\n", "@decorator\nclass Foo(Bar):", "print(f'{x!r:>10}')", "i++;--j;",
  "\"key\": [1, 2.5e-3, -7, null, true]", "https://example.com/path?a=1&b=2#frag",
];
const puncts = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
const uniPunct = ["。", "，", "、", "！", "？", "「", "」", "『", "』", "…", "—", "–", "‘", "’", "“",
  "”", "«", "»", "¿", "¡", "§", "¶", "•", "†", "‡", "※", "〜", "・", "：", "；", "（", "）", "【", "】",
  "€", "£", "¥", "©", "®", "™", "°", "±", "×", "÷", "√", "∞", "≈", "≠", "≤", "≥", "→", "⇒", "∀", "∑",
  "♥", "★", "☆", "♪", "¬", "¦", "^", "`", "´", "¨", "˜", "｜", "▁", "Ġ", "Ċ", "＄", "％", "＃"];
const spaces = [" ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2002",
  "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u000b", "\u000c", "\u1680", "\u202f",
  "\u205f", " \n", "\t\t", "    ", "\n\n\n", " \r\n ", "\u00a0\u00a0"];
const digits = [
  () => String(ri(10 ** (1 + ri(9)))), () => rep(() => range(0xff10, 0xff19), 1 + ri(6)),
  () => rep(() => range(0x0660, 0x0669), 1 + ri(5)), () => rep(() => range(0x0966, 0x096f), 1 + ri(5)),
  () => pick(["½", "¾", "⅓", "²", "³", "¹", "⁴", "₂", "Ⅻ", "ⅳ", "①", "⑩", "〇", "〸", "𝟘𝟙"]),
  () => (rnd() * 1000).toFixed(ri(5)), () => "-" + ri(1000) + "e" + ri(20), () => "0x" + ri(1 << 30).toString(16),
  () => "00" + ri(999), () => ri(100) + "," + ri(1000) + "," + ri(1000),
];
const scripts = [
  () => rep(() => range(0x4e00, 0x9fa5), 1 + ri(12)),           // CJK in the DeepSeek range
  () => rep(() => range(0x9fa6, 0x9fef), 1 + ri(3)),            // CJK just past it
  () => rep(() => range(0x3400, 0x4db5), 1 + ri(3)),            // CJK Ext A
  () => rep(() => range(0x3041, 0x3096), 1 + ri(10)),           // hiragana
  () => rep(() => range(0x30a1, 0x30fa), 1 + ri(10)) + (rnd() < 0.3 ? "ー" : ""), // katakana
  () => rep(() => range(0xff66, 0xff9d), 1 + ri(6)),            // halfwidth katakana
  () => rep(() => range(0xac00, 0xd7a3), 1 + ri(8)),            // Hangul syllables
  () => rep(() => range(0x1100, 0x1112), 1 + ri(3)) + rep(() => range(0x1161, 0x1175), 1 + ri(2)), // jamo
  () => rep(() => range(0x0430, 0x044f), 2 + ri(8)),            // Cyrillic
  () => rep(() => range(0x03b1, 0x03c9), 2 + ri(8)),            // Greek
  () => rep(() => range(0x0627, 0x064a), 2 + ri(8)) + (rnd() < 0.5 ? range(0x064b, 0x0652) : ""), // Arabic
  () => rep(() => range(0x05d0, 0x05ea), 2 + ri(6)),            // Hebrew
  () => rep(() => range(0x0915, 0x0939) + (rnd() < 0.5 ? range(0x093e, 0x094c) : ""), 1 + ri(5)), // Devanagari
  () => rep(() => range(0x0e01, 0x0e2e) + (rnd() < 0.3 ? range(0x0e31, 0x0e3a) : ""), 2 + ri(6)), // Thai
  () => rep(() => range(0x00c0, 0x00ff), 1 + ri(6)),            // Latin-1 letters (and ×, ÷)
  () => rep(() => range(0x0100, 0x017e), 1 + ri(6)),            // Latin Extended-A (no U+017F)
  () => pick(words) + rep(() => range(0x0300, 0x036f), 1 + ri(3)), // combining marks
  () => rep(() => range(0x0300, 0x036f), 1 + ri(3)),            // marks with no base
  () => rep(() => range(0x1d400, 0x1d4ff), 1 + ri(4)),          // math alphanumerics
  () => rep(() => range(0xe000, 0xe0ff), 1 + ri(3)),            // private use
  () => rep(() => range(0x01, 0x1f), 1 + ri(3)),                // C0 controls
  () => pick(["\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\u0000", "\u007f"]),
];
const emoji = [
  "😀", "🦀", "🚀", "👍", "👍🏽", "❤️", "❤", "✨", "🎉", "🇺🇸", "🇯🇵", "1️⃣", "#️⃣", "👨‍👩‍👧‍👦",
  "🏳️‍🌈", "👩🏿‍💻", "🧑‍🤝‍🧑", "☕", "⚡", "🤖", "😂😂😂", "🫠", "©️", "™️",
];
const added = ["<｜User｜>", "<｜Assistant｜>", "<|EOT|>", "<｜begin▁of▁sentence｜>",
  "<｜end▁of▁sentence｜>", "<｜fim▁hole｜>", "<｜tool▁sep｜>", "<｜place▁holder▁no▁7｜>",
  "<｜▁pad▁｜>", "<｜User", "｜User｜>", "<|EOT|", "<｜end▁of▁sentence", "<｜place▁holder▁no▁800｜>",
  "<<｜User｜>>", "<｜User｜><｜Assistant｜>", "<|eot|>", "<｜user｜>"];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "'D",
  "don't", "I'm", "we'll", "it's", "THEY'RE", "o'clock", "'x", "''s"];

const frag = [
  () => pick(words), () => pick(words) + " " + pick(words) + " " + pick(words), () => pick(code),
  () => rep(() => pick(puncts), 1 + ri(6)), () => pick(uniPunct), () => pick(spaces),
  () => pick(digits)(), () => pick(scripts)(), () => pick(emoji), () => pick(added),
  () => pick(contractions), () => " " + pick(words), () => pick(words).toUpperCase(),
  () => rep(() => pick(spaces), 1 + ri(4)), () => pick(puncts) + pick(words),
];

function longRun() {
  const n = 200 + ri(10000);
  const unit = pick(["a", "ab", " ", "\n", "\t", "0", "12", "中", "あ", "😀", "-", "=", "é", "\u00a0",
    "e\u0301", "한", "xyz ", ". ", "\r\n"]);
  let s = "";
  while (s.length < n) s += unit;
  return (rnd() < 0.5 ? pick(words) + " " : "") + s + (rnd() < 0.5 ? " " + pick(words) : "");
}

const fixed = [
  "", " ", "  ", "\n", "\r\n", "\t", "a", "Hello, world! This is a test.", "你好，世界！今天天气很好。",
  "こんにちは世界、カタカナとひらがな", "I ❤️ 🦀 and 👨‍👩‍👧‍👦",
  "def f(x):\n\treturn x*2  # comment\n\n\n    if x>10:\r\n        pass\n",
  "1234567 3.14159 -42 1e10 ２０２４ 00042", "  leading and trailing  ", "café naïve e\u0301 a\u00a0b",
  "<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>", "x \n y", "x  \n  y", "a\u3000\u3000b",
  "  \t\n x", "!!!\n\n", " !!!\r\n\r\nabc", "'s's's", "(Hello) [World] {x}", "\u00a0 x", " \u00a0x",
];

const out = [];
for (const t of fixed) out.push(t);
while (out.length < count) {
  let s;
  if (rnd() < 0.015) s = longRun();
  else {
    s = "";
    const n = 1 + ri(rnd() < 0.2 ? 30 : 10);
    for (let i = 0; i < n; i++) s += pick(frag)();
  }
  out.push(s);
}
process.stdout.write(out.map((t) => JSON.stringify({ text: t })).join("\n") + "\n");
