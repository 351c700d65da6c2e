#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora and dictionaries (stdlib only).

    python3 fuzz/seeds.py OUT_DIR

OUT_DIR/corpus/<target>/ gets seed files (existing files are kept, so a
corpus grows across runs) and OUT_DIR/<target>.dict the target's libFuzzer
dictionary.  Seeds come from the repository (tests/template_cases, the demo
model models/kjv-moe, tests/data) and, when MLXCEL_FIXTURES points at the
reference fixtures, from those too; nothing is copied into the repository.
Every seed is at most MAX_LEN bytes (scripts/fuzz.sh runs with -max_len)."""
import hashlib
import json
import os
import struct
import sys

MAX_LEN = 65536
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fixtures():
    d = os.environ.get("MLXCEL_FIXTURES")
    return d if d and os.path.isdir(d) else None


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class Corpus:
    def __init__(self, out, target):
        self.dir = os.path.join(out, "corpus", target)
        os.makedirs(self.dir, exist_ok=True)
        self.n = 0

    def add(self, data, name=None):
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        if len(data) > MAX_LEN:
            return
        name = name or "seed_" + hashlib.sha1(data).hexdigest()[:16]
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)
        self.n += 1


def dict_entry(word):
    r"""A libFuzzer dictionary line: "..." with \\, \" and \xNN escapes."""
    out = []
    for b in word if isinstance(word, bytes) else word.encode("utf-8"):
        ch = chr(b)
        if ch in '\\"':
            out.append("\\" + ch)
        elif 0x20 <= b < 0x7F:
            out.append(ch)
        else:
            out.append("\\x%02X" % b)
    return '"' + "".join(out) + '"'


def write_dict(out, target, words):
    with open(os.path.join(out, target + ".dict"), "w", encoding="ascii") as f:
        for w in words:
            f.write(dict_entry(w) + "\n")


def tokenizer_dirs():
    """(name, folder) of the tokenizers fuzz_tokenize loads, in its order."""
    dirs = [("kjv-moe", os.path.join(ROOT, "models", "kjv-moe"))]
    fx = fixtures()
    if fx:
        for name in ["qwen2_moe_tiny_chat", "tokenizers/qwen3", "tokenizers/olmoe",
                     "tokenizers/mixtral", "tokenizers/phimoe"]:
            if os.path.isdir(os.path.join(fx, name)):
                dirs.append((name, os.path.join(fx, name)))
    return dirs


# ---- the older targets: safetensors, config.json, tool calls ----

def seeds_safetensors(out):
    c = Corpus(out, "fuzz_safetensors")

    def st(header, data=b""):
        h = header.encode()
        return struct.pack("<Q", len(h)) + h + data

    c.add(st('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b"abcdefgh"), "seed_min")
    c.add(st('{"__metadata__":{"format":"mlx"},"b":{"dtype":"U8","shape":[1,3],"data_offsets":[0,3]},'
             '"c":{"dtype":"BF16","shape":[],"data_offsets":[3,5]}}', b"xyzwv"), "seed_meta")
    c.add(st("{}"), "seed_empty")
    fx = fixtures()
    if fx:
        for d in sorted(os.listdir(fx)):
            p = os.path.join(fx, d)
            if not os.path.isdir(p):
                continue
            for f in sorted(os.listdir(p)):
                if f.endswith(".safetensors"):
                    with open(os.path.join(p, f), "rb") as fh:
                        (hlen,) = struct.unpack("<Q", fh.read(8))
                        fh.seek(0)
                        # the header and a little data: whole files are MBs
                        c.add(fh.read(8 + hlen + 64), f"{d}_{f}")
    write_dict(out, "fuzz_safetensors", ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"',
                                         '"F32"', '"F16"', '"BF16"', '"U32"', '"I64"', '"BOOL"',
                                         "18446744073709551615", "9007199254740993", "-1", "1e308"])


def seeds_config(out):
    c = Corpus(out, "fuzz_config")
    c.add('{"model_type":"qwen2_moe","hidden_size":8,"rope_parameters":{"rope_type":"default",'
          '"rope_theta":10000.0},"eos_token_id":[1,2],"sliding_window":null,"quantization":'
          '{"group_size":64,"bits":4,"lm_head":false,"m.gate":{"bits":8}}}', "seed_min.json")
    dirs = [os.path.join(ROOT, "models", "kjv-moe")]
    fx = fixtures()
    if fx:
        dirs += [os.path.join(fx, d) for d in sorted(os.listdir(fx))]
    for p in dirs:
        if not os.path.isdir(p):
            continue
        for f in sorted(os.listdir(p)):
            if f.endswith(".json") and not f.startswith("tokenizer"):
                with open(os.path.join(p, f), "rb") as fh:
                    c.add(fh.read(), f"{os.path.basename(p)}_{f}")
    write_dict(out, "fuzz_config", ['"quantization"', '"quantization_config"', '"group_size"', '"bits"',
                                    '"rope_parameters"', '"rope_scaling"', '"rope_theta"', '"eos_token_id"',
                                    '"num_local_experts"', '"mlp_only_layers"', '"sliding_window"',
                                    "null", "false", "true"])


def seeds_toolcall(out):
    c = Corpus(out, "fuzz_toolcall")
    c.add(b'\x04Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": [1, "}"]}}\n</tool_call>', "seed_hermes")
    c.add(b'\x07[TOOL_CALLS] [{"name": "f", "arguments": {}, "id": "abcDEF123"}]', "seed_mistral")
    write_dict(out, "fuzz_toolcall", ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", '"name"',
                                      '"arguments"', '"parameters"', '"id"'])


# ---- tokenizers ----

def trimmed_tokenizer(tj, keep=400):
    """tokenizer.json with its vocabulary cut to the first ids (and the
    added tokens' ids) and the merges whose parts all survive."""
    t = json.loads(json.dumps(tj))
    m = t.get("model", {})
    vocab = m.get("vocab")
    if isinstance(vocab, dict):
        added = {a.get("id") for a in t.get("added_tokens", [])}
        m["vocab"] = {k: v for k, v in vocab.items() if v < keep or v in added}
        merges = []
        for mg in m.get("merges", []):
            a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
            if a in m["vocab"] and b in m["vocab"] and a + b in m["vocab"]:
                merges.append(mg)
        m["merges"] = merges[:300]
    return json.dumps(t, ensure_ascii=False)


def seeds_tokenizer_load(out):
    c = Corpus(out, "fuzz_tokenizer_load")
    for name, d in tokenizer_dirs():
        tj = load_json(os.path.join(d, "tokenizer.json"))
        for keep in (64, 400):
            c.add(trimmed_tokenizer(tj, keep), f"seed_{name.replace('/', '_')}_{keep}")
    c.add('{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}', "seed_tiny_bpe")
    c.add('{"model":{"type":"BPE","vocab":{"<unk>":0,"\u2581":1,"a":2,"<0x41>":3},"merges":[],'
          '"unk_token":"<unk>","byte_fallback":true},"normalizer":{"type":"Sequence","normalizers":'
          '[{"type":"Prepend","prepend":"\u2581"},{"type":"Replace","pattern":{"String":" "},'
          '"content":"\u2581"}]},"decoder":{"type":"Sequence","decoders":[{"type":"Replace",'
          '"pattern":{"String":"\u2581"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},'
          '{"type":"Strip","content":" ","start":1,"stop":0}]}}', "seed_tiny_sp")
    write_dict(out, "fuzz_tokenizer_load", [
        '"model"', '"vocab"', '"merges"', '"type"', '"BPE"', '"WordPiece"', '"Unigram"',
        '"normalizer"', '"pre_tokenizer"', '"decoder"', '"post_processor"', '"added_tokens"',
        '"Sequence"', '"normalizers"', '"pretokenizers"', '"decoders"', '"NFC"', '"NFKC"', '"NFD"',
        '"Lowercase"', '"Prepend"', '"Replace"', '"Strip"', '"StripAccents"', '"Split"', '"ByteLevel"',
        '"Metaspace"', '"Digits"', '"Whitespace"', '"Punctuation"', '"ByteFallback"', '"Fuse"',
        '"pattern"', '"Regex"', '"String"', '"behavior"', '"Isolated"', '"MergedWithPrevious"',
        '"Removed"', '"invert"', '"content"', '"special"', '"normalized"', '"lstrip"', '"rstrip"',
        '"single_word"', '"id"', '"unk_token"', '"byte_fallback"', '"fuse_unk"',
        '"continuing_subword_prefix"', '"end_of_word_suffix"', '"ignore_merges"', '"add_prefix_space"',
        '"use_regex"', '"replacement"', '"prepend_scheme"', '"always"', '"first"', '"never"',
        '"\\u2581"', "(?i:", "\\p{L}", "\\p{N}", "(?!\\S)", "[^\\s\\p{L}\\p{N}]", "+", "*", "null",
        "true", "false"])


def seeds_tokenize(out):
    c = Corpus(out, "fuzz_tokenize")
    texts, idlists = set(), []
    fx = fixtures()
    case_files = []
    if fx:
        case_files.append(os.path.join(fx, "tokenizer_cases.json"))
        case_files += [os.path.join(fx, "tokenizers", d, "cases.json")
                       for d in sorted(os.listdir(os.path.join(fx, "tokenizers")))]
    for p in case_files:
        if not os.path.exists(p):
            continue
        j = load_json(p)
        for case in j.get("cases", []):
            if isinstance(case.get("text"), str):
                texts.add(case["text"])
            if isinstance(case.get("ids"), list):
                idlists.append(case["ids"])
        for case in j.get("chat_cases", []):
            if isinstance(case.get("rendered"), str):
                texts.add(case["rendered"])
    texts |= {"Hello, world!", "  leading spaces\tand\ttabs\r\n", "caf\u00e9 cafe\u0301 \u2581x",
              "<|im_start|>user\nhi<|im_end|>", "\U0001f600 emoji \u4e2d\u6587 \u0645\u0631\u062d\u0628\u0627",
              "I'm you're 12345 3.14"}
    n = len(tokenizer_dirs())
    for i in range(n):
        for t in sorted(texts):
            for mode in (0, 1):
                c.add(bytes([i | mode << 3]) + t.encode("utf-8"))
        for ids in idlists:
            c.add(bytes([i | 2 << 3]) + b"".join(struct.pack("<H", x & 0xFFFF) for x in ids))
            c.add(bytes([i | 2 << 3 | 1 << 5 | 1 << 6]) + b"".join(struct.pack("<i", x) for x in ids))
    write_dict(out, "fuzz_tokenize", ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>",
                                      "<unk>", "\u2581", "\r\n", "'s", "'ll", "\u0301", b"\xff", b"\xc3"])


# ---- chat templates ----

def seeds_jinja(out):
    c = Corpus(out, "fuzz_jinja")
    tc = os.path.join(ROOT, "tests", "template_cases")
    for f in sorted(os.listdir(tc)):
        if not f.endswith(".json"):
            continue
        for case in load_json(os.path.join(tc, f)):
            c.add(b"\x00" + case["template"].encode() + b"\x00" + json.dumps(case.get("context", {})).encode())
    templates = []
    dirs = [os.path.join(ROOT, "models", "kjv-moe")]
    fx = fixtures()
    if fx:
        dirs += [d for _, d in tokenizer_dirs()]
    chat_cases = []
    for d in dirs:
        p = os.path.join(d, "tokenizer_config.json")
        if os.path.exists(p):
            ct = load_json(p).get("chat_template")
            if isinstance(ct, str):
                templates.append(ct)
            elif isinstance(ct, list):
                templates += [x.get("template", "") for x in ct if isinstance(x, dict)]
        p = os.path.join(d, "cases.json")
        if os.path.exists(p):
            for case in load_json(p).get("chat_cases", []):
                chat_cases.append((d, case))
    with open(os.path.join(ROOT, "tests", "data", "mistral_tools.jinja"), encoding="utf-8") as f:
        templates.append(f.read())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello.", "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "42"}]
    for t in templates:
        for gen in (0, 1):
            ctx = {"messages": msgs, "tools": [{"type": "function", "function": {
                "name": "f", "parameters": {"type": "object"}}}]}
            c.add(bytes([1 | gen << 1]) + t.encode() + b"\x00" + json.dumps(ctx).encode())
    for d, case in chat_cases:
        p = os.path.join(d, "tokenizer_config.json")
        ct = load_json(p).get("chat_template")
        if not isinstance(ct, str):
            continue
        ctx = dict(case.get("extra_context") or {})
        ctx["messages"] = case.get("messages", [])
        if case.get("tools") is not None:
            ctx["tools"] = case["tools"]
        c.add(bytes([1 | (1 if case.get("add_generation_prompt") else 0) << 1]) + ct.encode() + b"\x00" +
              json.dumps(ctx).encode())
    write_dict(out, "fuzz_jinja", [
        "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", "for", "endfor", "if", "elif", "else",
        "endif", "set", "endset", "macro", "endmacro", "call", "endcall", "filter", "endfilter", "with",
        "endwith", "raw", "endraw", "namespace(", "loop.index", "loop.first", "loop.last", "range(",
        "messages", "message['role']", "message.content", "tools", "add_generation_prompt", "bos_token",
        "eos_token", "raise_exception(", "|tojson", "|length", "|trim", "|join(", "|map(", "|selectattr(",
        "|items", "|default(", "is defined", "is string", "is none", " not ", " in ", " and ", " or ", "~",
        "[::-1]", ".split(", ".strip(", ".startswith(", ".endswith(", ".replace(", ".upper()", "**", "//",
        "recursive", "loop(", "caller()", "'", "\"", '"role"', '"content"', '"tool_calls"', "null", "true"])


# ---- the server's request bodies ----

def seeds_server_request(out):
    c = Corpus(out, "fuzz_server_request")
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, who are you?"}]
    chat = [
        {"messages": msgs, "max_tokens": 8, "temperature": 0},
        {"model": "m", "messages": msgs, "stream": True, "stream_options": {"include_usage": True},
         "stop": ["\n", "END"], "seed": 7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "n": 2},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                   {"type": "text", "text": "part two"}]}],
         "logprobs": True, "top_logprobs": 3, "logit_bias": {"15": -100, "16": 5}},
        {"messages": msgs, "response_format": {"type": "json_object"}},
        {"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                    "required": ["a"], "additionalProperties": False}}}},
        {"messages": msgs, "grammar": 'root ::= "yes" | "no"'},
        {"messages": msgs, "tools": [tool], "tool_choice": "auto"},
        {"messages": msgs, "tools": [tool], "tool_choice": "required", "parallel_tool_calls": False},
        {"messages": msgs + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": "{\"city\": \"Paris\"}"}}]},
                             {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
         "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}, "max_completion_tokens": 4,
         "frequency_penalty": 0.5, "presence_penalty": 0.5, "repeat_penalty": 1.1},
    ]
    completion = [
        {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
        {"prompt": ["one", "two"], "n": 2, "stream": True, "echo": False, "logprobs": 2},
        {"prompt": [1, 2, 3], "max_tokens": 2},
        {"prompt": [[1, 2], [3, 4, 5]], "stop": "x", "suffix": None, "best_of": 1},
    ]
    n_tmpl = 3 if fixtures() else 2
    for t in range(n_tmpl):
        for body in chat:
            c.add(bytes([0 | t << 3]) + json.dumps(body).encode())
            c.add(bytes([2 | t << 3]) + json.dumps(body).encode())   # /apply-template
        for body in completion:
            c.add(bytes([1 | t << 3]) + json.dumps(body).encode())
    c.add(b"\x03" + json.dumps({"content": "Hello <|im_end|> world", "parse_special": False}).encode())
    c.add(b"\x04" + json.dumps({"tokens": [9707, 11, 1879, 0, 151643]}).encode())
    write_dict(out, "fuzz_server_request", [
        '"messages"', '"role"', '"content"', '"system"', '"user"', '"assistant"', '"tool"', '"prompt"',
        '"max_tokens"', '"max_completion_tokens"', '"temperature"', '"top_p"', '"top_k"', '"min_p"',
        '"stream"', '"stream_options"', '"include_usage"', '"stop"', '"seed"', '"n"', '"logprobs"',
        '"top_logprobs"', '"logit_bias"', '"response_format"', '"json_schema"', '"json_object"',
        '"schema"', '"grammar"', '"tools"', '"tool_choice"', '"tool_calls"', '"function"', '"name"',
        '"arguments"', '"parameters"', '"required"', '"auto"', '"none"', '"chat_template_kwargs"',
        '"echo"', '"suffix"', '"best_of"', '"tokens"', '"parse_special"', '"type"', '"text"',
        '"image_url"', "1e400", "-0", "9007199254740993", "null", "true", "false", "[]", "{}"])


# ---- grammars ----

GBNF = [
    ('root ::= "yes" | "no"', "yes"),
    ('root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"', "(1+23)-4"),
    ('root ::= "{" ws pair ("," ws pair)* "}"\npair ::= str ws ":" ws [0-9]+\n'
     'str ::= "\\"" [^"\\\\]* "\\""\nws ::= [ \\t\\n]*', '{"a": 1,"b":2}'),
    ('root ::= [a-z]{2,4} [^\\x00-\\x7f]? .\n# a comment', "abc\u00e9x"),
    ('root ::= x? y* z+\nx ::= "\\u00e9"\ny ::= [\\U0001F600-\\U0001F64F]\nz ::= "\\x41" | "\\n"', "\u00e9A"),
    ('root ::= ("ab" | "a" "b")* "c"', "ababc"),
]

SCHEMAS = [
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
      "required": ["a"], "additionalProperties": False}, '{"a": 1, "b": "x"}'),
    ({"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3}, "[1.5, -2]"),
    ({"enum": ["red", "green", 3, None]}, '"red"'),
    ({"const": {"k": [1, 2]}}, '{"k": [1, 2]}'),
    ({"anyOf": [{"type": "string", "minLength": 2, "maxLength": 4}, {"type": "boolean"}]}, "true"),
    ({"oneOf": [{"type": "null"}, {"$ref": "#/$defs/p"}], "$defs": {"p": {"type": "object", "properties": {
        "next": {"$ref": "#/$defs/p"}}}}}, "null"),
    ({"type": "array", "prefixItems": [{"type": "string", "format": "date"}, {"format": "uuid", "type": "string"}],
      "items": False}, '["2024-02-29", "123e4567-e89b-12d3-a456-426614174000"]'),
    ({"type": "object", "properties": {"t": {"type": "string", "format": "date-time"},
                                       "u": {"type": "string", "format": "time"}}}, '{"t": "2024-01-01T00:00:00Z"}'),
    ({"type": "integer", "minimum": -5, "maximum": 5}, "3"),
    ({"type": ["string", "null"]}, "null"),
    ({}, '{"any": [1, {"x": null}]}'),
]


def seeds_grammar(out):
    c = Corpus(out, "fuzz_gbnf")
    for g, text in GBNF:
        c.add(g.encode() + b"\x00" + text.encode())
    write_dict(out, "fuzz_gbnf", ["::=", "root", "|", "(", ")", "*", "+", "?", "{2,5}", "{3}", "{1,}", "[^",
                                  "]", "[a-z]", ".", '"', "\\x", "\\u", "\\U", "\\n", "\\\\", "#", "\n"])
    c = Corpus(out, "fuzz_schema")
    for s, text in SCHEMAS:
        c.add(json.dumps(s).encode() + b"\x00" + text.encode())
    write_dict(out, "fuzz_schema", [
        '"type"', '"object"', '"array"', '"string"', '"integer"', '"number"', '"boolean"', '"null"',
        '"properties"', '"required"', '"additionalProperties"', '"items"', '"prefixItems"', '"minItems"',
        '"maxItems"', '"enum"', '"const"', '"anyOf"', '"oneOf"', '"allOf"', '"$ref"', '"$defs"',
        '"definitions"', '"#/$defs/"', '"minLength"', '"maxLength"', '"minimum"', '"maximum"', '"format"',
        '"date"', '"time"', '"date-time"', '"uuid"', '"pattern"', "true", "false", "null", "{}", "[]"])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: seeds.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "corpus"), exist_ok=True)
    for f in (seeds_safetensors, seeds_config, seeds_toolcall, seeds_tokenizer_load, seeds_tokenize,
              seeds_jinja, seeds_server_request, seeds_grammar):
        f(out)
    print(f"seeds: corpora under {out}/corpus" + ("" if fixtures() else " (no fixtures: repository seeds only)"),
          file=sys.stderr)


if __name__ == "__main__":
    main()
