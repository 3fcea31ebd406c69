/*
 * Hugging Face tokenizer.json support for the tokenizers (tokenizer.h): not implemented yet;
 * loading such a file fails with a message.
 */
#include <stdlib.h>

#include "text/tokenizer_impl.h"

mts_tokenizer *mts_tokenizer_load_json(const char *data, size_t len, int lowercase, char *err, size_t errlen)
{
    (void)data, (void)len, (void)lowercase;
    mts_tok_err(err, errlen, "tokenizer.json: not supported yet");
    return NULL;
}

int mts_tok_model_word_ext(const mts_tokenizer *t, const uint32_t *w, size_t n, mts_ids *out)
{
    (void)t, (void)w, (void)n, (void)out;
    return -1;
}

int mts_pretok_run(const mts_tokenizer *t, const mts_cps *text, mts_word_fn fn, void *arg)
{
    (void)t, (void)text, (void)fn, (void)arg;
    return -1;
}

int mts_norm_apply_ext(const mts_norm_step *s, mts_cps *in, mts_cps *out)
{
    (void)s, (void)in, (void)out;
    return -1;
}

void mts_tokenizer_free_ext(mts_tokenizer *t) { (void)t; }
