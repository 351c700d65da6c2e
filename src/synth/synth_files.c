/* synth_files.c - the JSON files of a synthetic checkpoint: config.json,
 * generation_config.json, tokenizer.json (byte-level BPE) and
 * tokenizer_config.json (ChatML template).
 *
 * The tokenizer covers every id below vocab_size: 256 byte tokens in GPT-2's
 * byte-to-unicode order, then merges built deterministically (space+letter
 * and letter pairs in English letter-frequency order, then longer letter
 * runs, each one a previous token plus a letter, so every merge's parts exist
 * before it), then the special tokens at the top of the vocabulary. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "synth/synth.h"

/* ---- helpers ----------------------------------------------------------- */

static int write_json(cJSON *root, const char *dir, const char *file, mx_err *e)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory building JSON", path);
    FILE *f = fopen(path, "wb");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0)
        ok = 0;
    free(text);
    if (!ok)
        return mx_fail(e, MX_EIO, "%s: cannot write: %s", path, strerror(errno));
    return MX_OK;
}

/* Special tokens, lowest id first; they occupy the top ids of the vocab. */
typedef struct specials {
    const char *tok[3];
    int n;
    int first_id;
    int bos, eos, pad;        /* ids; -1 when none */
    const char *bos_s, *eos_s, *pad_s;
} specials;

static void get_specials(const mx_synth_plan *plan, specials *s)
{
    const mx_preset *P = plan->p;
    memset(s, 0, sizeof *s);
    if (P->chatml_specials) {
        s->tok[0] = "<|endoftext|>";
        s->tok[1] = "<|im_start|>";
        s->tok[2] = "<|im_end|>";
        s->n = 3;
        s->first_id = P->vocab - 3;
        s->bos = s->first_id;          /* <|endoftext|>, as Qwen's config says */
        s->eos = s->first_id + 2;      /* <|im_end|>: the end of a chat turn */
        s->pad = s->first_id;
        s->bos_s = NULL;               /* Qwen prepends no BOS */
        s->eos_s = "<|im_end|>";
        s->pad_s = "<|endoftext|>";
    } else {
        s->tok[0] = "<s>";
        s->tok[1] = "</s>";
        s->n = 2;
        s->first_id = P->vocab - 2;
        s->bos = s->first_id;
        s->eos = s->first_id + 1;
        s->pad = -1;
        s->bos_s = "<s>";
        s->eos_s = "</s>";
        s->pad_s = NULL;
    }
}

static const char *dtype_torch(mx_dtype t)
{
    return t == MX_F16 ? "float16" : t == MX_BF16 ? "bfloat16" : "float32";
}

/* ---- config.json / generation_config.json ------------------------------ */

static cJSON *quant_block(const mx_synth_plan *plan)
{
    cJSON *q = cJSON_CreateObject();
    cJSON_AddNumberToObject(q, "group_size", plan->opts.group_size);
    cJSON_AddNumberToObject(q, "bits", plan->opts.bits);
    /* Per-module overrides for the routers (and shared-expert gates), the
     * way mlx-lm records a quant predicate's choices. */
    for (size_t i = 0; i < plan->n; i++) {
        const mx_synth_tensor *t = &plan->t[i];
        if (t->kind != MX_SYNTH_QWEIGHT)
            continue;
        /* the routers and shared-expert gates: their own bits and group */
        if (t->bits == plan->opts.bits && t->group_size == plan->opts.group_size)
            continue;
        cJSON *o = cJSON_AddObjectToObject(q, t->module);
        cJSON_AddNumberToObject(o, "group_size", t->group_size);
        cJSON_AddNumberToObject(o, "bits", t->bits);
    }
    return q;
}

cJSON *mx_synth_config_json(const mx_synth_plan *plan)
{
    const mx_preset *P = plan->p;
    specials sp;
    get_specials(plan, &sp);
    cJSON *c = cJSON_CreateObject();
    if (!c)
        return NULL;
    cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(plan->fam->architecture));
    cJSON_AddStringToObject(c, "model_type", plan->fam->model_type);
    cJSON_AddNumberToObject(c, "bos_token_id", sp.bos);
    cJSON_AddNumberToObject(c, "eos_token_id", sp.eos);
    if (sp.pad >= 0)
        cJSON_AddNumberToObject(c, "pad_token_id", sp.pad);
    cJSON_AddStringToObject(c, "torch_dtype", dtype_torch(P->dtype));
    cJSON_AddNumberToObject(c, "vocab_size", P->vocab);
    cJSON_AddNumberToObject(c, "hidden_size", P->hidden);
    cJSON_AddNumberToObject(c, "intermediate_size", P->intermediate);
    cJSON_AddNumberToObject(c, "num_hidden_layers", P->layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", P->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", P->kv_heads);
    if (P->head_dim * P->heads != P->hidden)
        cJSON_AddNumberToObject(c, "head_dim", P->head_dim);
    cJSON_AddNumberToObject(c, "rms_norm_eps", P->rms_eps);
    cJSON_AddNumberToObject(c, "rope_theta", P->rope_theta);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", P->tied);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "max_position_embeddings", P->max_position);
    cJSON_AddNumberToObject(c, "num_experts_per_tok", P->top_k);
    /* the family's own keys (expert counts, routing flags, windows) */
    if (plan->fam->synth_config)
        plan->fam->synth_config(P, c);
    cJSON_AddNumberToObject(c, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(c, "output_router_logits", 0);
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    cJSON_AddBoolToObject(c, "use_cache", 1);
    return c;
}

int mx_synth_write_config(const mx_synth_plan *plan, const char *dir, mx_err *e)
{
    const mx_preset *P = plan->p;
    specials sp;
    get_specials(plan, &sp);
    cJSON *c = mx_synth_config_json(plan);
    if (c) {
        cJSON_AddItemToObject(c, "quantization", quant_block(plan));
        cJSON_AddItemToObject(c, "quantization_config", quant_block(plan));
    }
    int rc = write_json(c, dir, "config.json", e);
    if (rc)
        return rc;

    cJSON *g = cJSON_CreateObject();
    cJSON_AddNumberToObject(g, "bos_token_id", sp.bos);
    cJSON *eos = cJSON_AddArrayToObject(g, "eos_token_id");
    cJSON_AddItemToArray(eos, cJSON_CreateNumber(sp.eos));
    if (P->chatml_specials)   /* chat models stop on <|endoftext|> too */
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(sp.first_id));
    if (sp.pad >= 0)
        cJSON_AddNumberToObject(g, "pad_token_id", sp.pad);
    cJSON_AddBoolToObject(g, "do_sample", 0);
    return write_json(g, dir, "generation_config.json", e);
}

/* ---- tokenizer.json ---------------------------------------------------- */

/* GPT-2's reversible byte -> unicode map: printable Latin-1 bytes map to
 * themselves, the rest to U+0100 upward.  Token id of byte b = position of b
 * in that order. */
typedef struct byte_map {
    int id_of[256];          /* byte -> token id */
    int byte_of[256];        /* token id -> byte */
    char str[256][4];        /* byte -> UTF-8 of its code point */
} byte_map;

static void build_byte_map(byte_map *m)
{
    int id = 0, extra = 0;
    int printable[256] = {0};
    for (int b = 0; b < 256; b++)
        printable[b] = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    for (int b = 0; b < 256; b++)
        if (printable[b]) {
            m->id_of[b] = id;
            m->byte_of[id++] = b;
        }
    for (int b = 0; b < 256; b++) {
        unsigned cp = printable[b] ? (unsigned)b : 256u + (unsigned)extra++;
        if (!printable[b]) {
            m->id_of[b] = id;
            m->byte_of[id++] = b;
        }
        char *s = m->str[b];
        if (cp < 0x80) {
            s[0] = (char)cp;
            s[1] = 0;
        } else {
            s[0] = (char)(0xc0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3f));
            s[2] = 0;
        }
    }
}

typedef struct merge_list {
    int (*pair)[2];          /* left id, right id */
    char **str;              /* string of every token id (bytes + merges) */
    int n;                   /* merges */
} merge_list;

static void merges_free(merge_list *ml, int ntok)
{
    if (ml->str)
        for (int i = 0; i < ntok; i++)
            free(ml->str[i]);
    free(ml->str);
    free(ml->pair);
}

static char *concat(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

/* Builds `want` merges (see the file comment for the order). */
static int build_merges(const byte_map *bm, int want, merge_list *ml, mx_err *e)
{
    static const char letters[] = "etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ";
    const int nl = (int)sizeof letters - 1;
    int ntok = 256 + want;
    memset(ml, 0, sizeof *ml);
    ml->pair = malloc((size_t)(want > 0 ? want : 1) * sizeof *ml->pair);
    ml->str = calloc((size_t)ntok, sizeof *ml->str);
    if (!ml->pair || !ml->str)
        goto oom;
    for (int id = 0; id < 256; id++)
        if (!(ml->str[id] = concat(bm->str[bm->byte_of[id]], "")))
            goto oom;
    /* atom 0 is the space, atoms 1..nl the letters */
    int atom_id[1 + 52];
    atom_id[0] = bm->id_of[' '];
    for (int i = 0; i < nl; i++)
        atom_id[1 + i] = bm->id_of[(unsigned char)letters[i]];
    int n = 0;
    /* Level 2: (atom, letter) pairs by increasing rank sum. */
    for (int sum = 1; sum <= 2 * nl && n < want; sum++)
        for (int ra = 0; ra <= nl && n < want; ra++) {
            int rb = sum - ra;
            if (rb < 1 || rb > nl)
                continue;
            ml->pair[n][0] = atom_id[ra];
            ml->pair[n][1] = atom_id[rb];
            n++;
        }
    /* Longer tokens: each token of the previous level plus a letter. */
    int lo = 0, hi = n;
    while (n < want) {
        for (int t = lo; t < hi && n < want; t++)
            for (int r = 1; r <= nl && n < want; r++) {
                ml->pair[n][0] = 256 + t;
                ml->pair[n][1] = atom_id[r];
                n++;
            }
        lo = hi;
        hi = n;
    }
    for (int i = 0; i < n; i++)
        if (!(ml->str[256 + i] = concat(ml->str[ml->pair[i][0]], ml->str[ml->pair[i][1]])))
            goto oom;
    ml->n = n;
    return MX_OK;
oom:
    merges_free(ml, ntok);
    memset(ml, 0, sizeof *ml);
    return mx_fail(e, MX_ENOMEM, "synth: out of memory building the tokenizer");
}

static cJSON *added_token(int id, const char *content)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", id);
    cJSON_AddStringToObject(t, "content", content);
    cJSON_AddBoolToObject(t, "single_word", 0);
    cJSON_AddBoolToObject(t, "lstrip", 0);
    cJSON_AddBoolToObject(t, "rstrip", 0);
    cJSON_AddBoolToObject(t, "normalized", 0);
    cJSON_AddBoolToObject(t, "special", 1);
    return t;
}

/* Qwen2's pre-tokenizer split (the same regex Qwen's tokenizer.json uses). */
static const char qwen2_split[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static cJSON *byte_level(int add_prefix_space, int use_regex)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(b, "trim_offsets", 1);
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

static cJSON *pre_tokenizer(const mx_synth_plan *plan)
{
    /* Qwen families: the Qwen2 split then byte-level (no regex); the others
     * the plain GPT-2 byte-level pre-tokenizer with its own regex. */
    if (!plan->p->qwen_tokenizer)
        return byte_level(0, 1);
    cJSON *seq = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON *pat = cJSON_AddObjectToObject(split, "pattern");
    cJSON_AddStringToObject(pat, "Regex", qwen2_split);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(list, split);
    cJSON_AddItemToArray(list, byte_level(0, 0));
    return seq;
}

/* ---- tokenizer_config.json --------------------------------------------- */

static const char chatml_template[] =
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

int mx_synth_write_tokenizer(const mx_synth_plan *plan, const char *dir, mx_err *e)
{
    const mx_preset *P = plan->p;
    specials sp;
    get_specials(plan, &sp);
    int want = P->vocab - sp.n - 256;
    if (want < 0)
        return mx_fail(e, MX_EINVAL, "synth %s: vocab %d too small for 256 byte tokens and "
                       "%d special tokens", P->name, P->vocab, sp.n);
    byte_map bm;
    build_byte_map(&bm);
    merge_list ml;
    int rc = build_merges(&bm, want, &ml, e);
    if (rc)
        return rc;

    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < sp.n; i++)
        cJSON_AddItemToArray(added, added_token(sp.first_id + i, sp.tok[i]));
    if (P->qwen_tokenizer) {
        cJSON *norm = cJSON_AddObjectToObject(root, "normalizer");
        cJSON_AddStringToObject(norm, "type", "NFC");
    } else {
        cJSON_AddNullToObject(root, "normalizer");
    }
    cJSON_AddItemToObject(root, "pre_tokenizer", pre_tokenizer(plan));
    cJSON_AddNullToObject(root, "post_processor");
    cJSON_AddItemToObject(root, "decoder", byte_level(1, 1));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddStringToObject(model, "continuing_subword_prefix", "");
    cJSON_AddStringToObject(model, "end_of_word_suffix", "");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int id = 0; id < 256 + ml.n; id++)
        cJSON_AddItemToObject(vocab, ml.str[id], cJSON_CreateNumber(id));
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < ml.n; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(ml.str[ml.pair[i][0]]));
        cJSON_AddItemToArray(pair, cJSON_CreateString(ml.str[ml.pair[i][1]]));
        cJSON_AddItemToArray(merges, pair);
    }
    merges_free(&ml, 256 + ml.n);
    if ((rc = write_json(root, dir, "tokenizer.json", e)))
        return rc;

    cJSON *tc = cJSON_CreateObject();
    cJSON_AddBoolToObject(tc, "add_prefix_space", 0);
    if (sp.bos_s)
        cJSON_AddStringToObject(tc, "bos_token", sp.bos_s);
    else
        cJSON_AddNullToObject(tc, "bos_token");
    cJSON_AddStringToObject(tc, "eos_token", sp.eos_s);
    if (sp.pad_s)
        cJSON_AddStringToObject(tc, "pad_token", sp.pad_s);
    else
        cJSON_AddNullToObject(tc, "pad_token");
    cJSON_AddNullToObject(tc, "unk_token");
    cJSON_AddNumberToObject(tc, "model_max_length", P->max_position);
    cJSON_AddStringToObject(tc, "chat_template", chatml_template);
    cJSON_AddStringToObject(tc, "tokenizer_class", P->chatml_specials ? "Qwen2Tokenizer"
                                                                       : "PreTrainedTokenizerFast");
    cJSON_AddBoolToObject(tc, "split_special_tokens", 0);
    cJSON *dec = cJSON_AddObjectToObject(tc, "added_tokens_decoder");
    for (int i = 0; i < sp.n; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", sp.first_id + i);
        cJSON *t = cJSON_AddObjectToObject(dec, key);
        cJSON_AddStringToObject(t, "content", sp.tok[i]);
        cJSON_AddBoolToObject(t, "special", 1);
        cJSON_AddBoolToObject(t, "normalized", 0);
        cJSON_AddBoolToObject(t, "lstrip", 0);
        cJSON_AddBoolToObject(t, "rstrip", 0);
        cJSON_AddBoolToObject(t, "single_word", 0);
    }
    return write_json(tc, dir, "tokenizer_config.json", e);
}
