#!/usr/bin/env python3
"""generate.py - greedy generation with libmlxcel through ctypes (standard library only).

    python3 generate.py MODEL_DIR "Once upon a time" [MAX_TOKENS] [--chat] [--ids]

--chat sends the prompt as a user message through the model's chat template;
--ids prints the token ids instead of the text.  The library is found as
libmlxcel.so.0 (LD_LIBRARY_PATH, the system's paths) or at $MLXCEL_LIB."""
import ctypes as C
import json
import os
import sys

lib = C.CDLL(os.environ.get("MLXCEL_LIB", "libmlxcel.so.0"))


class Sampling(C.Structure):  # mlxcel_sampling, member for member
    _fields_ = [("size", C.c_size_t), ("temperature", C.c_float), ("top_k", C.c_int),
                ("top_p", C.c_float), ("min_p", C.c_float), ("repeat_penalty", C.c_float),
                ("repeat_last_n", C.c_int), ("frequency_penalty", C.c_float),
                ("presence_penalty", C.c_float), ("seed", C.c_uint64)]


class GenerateOptions(C.Structure):  # mlxcel_generate_options
    _fields_ = [("size", C.c_size_t), ("max_tokens", C.c_int), ("stop", C.POINTER(C.c_char_p)),
                ("n_stop", C.c_size_t), ("ignore_eos", C.c_int), ("keep_special", C.c_int)]


TOKEN_CB = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int32, C.POINTER(C.c_char), C.c_size_t)
lib.mlxcel_last_error.restype = C.c_char_p
lib.mlxcel_free.argtypes = [C.c_void_p]
lib.mlxcel_model_load.argtypes = [C.c_char_p, C.c_void_p, C.POINTER(C.c_void_p)]
lib.mlxcel_model_free.argtypes = lib.mlxcel_context_free.argtypes = [C.c_void_p]
lib.mlxcel_tokenize.argtypes = [C.c_void_p, C.c_char_p, C.c_size_t, C.c_int,
                                C.POINTER(C.POINTER(C.c_int32)), C.POINTER(C.c_size_t)]
lib.mlxcel_chat_render.argtypes = [C.c_void_p, C.c_char_p, C.c_char_p, C.c_char_p, C.c_int,
                                   C.POINTER(C.c_void_p)]
lib.mlxcel_context_new.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_void_p)]
lib.mlxcel_context_set_sampling.argtypes = [C.c_void_p, C.POINTER(Sampling)]
lib.mlxcel_generate.argtypes = [C.c_void_p, C.POINTER(C.c_int32), C.c_size_t,
                                C.POINTER(GenerateOptions), TOKEN_CB, C.c_void_p, C.POINTER(C.c_int)]


def check(rc):
    if rc != 0:
        sys.exit("generate.py: " + lib.mlxcel_last_error().decode())


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) < 2:
        sys.exit(__doc__)
    model_dir, prompt = args[0], args[1]
    max_tokens = int(args[2]) if len(args) > 2 else 64
    ids_only = "--ids" in sys.argv

    model, ctx = C.c_void_p(), C.c_void_p()
    check(lib.mlxcel_model_load(model_dir.encode(), None, C.byref(model)))
    if "--chat" in sys.argv:
        rendered = C.c_void_p()
        messages = json.dumps([{"role": "user", "content": prompt}])
        check(lib.mlxcel_chat_render(model, messages.encode(), None, None, 1, C.byref(rendered)))
        prompt = C.string_at(rendered).decode()
        lib.mlxcel_free(rendered)
    text = prompt.encode()
    ids, n = C.POINTER(C.c_int32)(), C.c_size_t()
    check(lib.mlxcel_tokenize(model, text, len(text), 1, C.byref(ids), C.byref(n)))

    check(lib.mlxcel_context_new(model, 0, C.byref(ctx)))
    sampling = Sampling()
    lib.mlxcel_sampling_init(C.byref(sampling))
    sampling.temperature = 0  # greedy
    check(lib.mlxcel_context_set_sampling(ctx, C.byref(sampling)))
    opts = GenerateOptions()
    lib.mlxcel_generate_options_init(C.byref(opts))
    opts.max_tokens = max_tokens

    def on_token(user, token, piece, length):
        if ids_only and token >= 0:
            print(token)
        elif not ids_only and length:
            sys.stdout.buffer.write(C.string_at(piece, length))
        sys.stdout.flush()
        return 0  # nonzero would stop the generation

    check(lib.mlxcel_generate(ctx, ids, n, C.byref(opts), TOKEN_CB(on_token), None, None))
    if not ids_only:
        print()
    lib.mlxcel_free(ids)
    lib.mlxcel_context_free(ctx)
    lib.mlxcel_model_free(model)


if __name__ == "__main__":
    main()
