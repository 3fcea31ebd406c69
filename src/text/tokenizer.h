/*
 * Text tokenizers for the embedding models: texts in, token ids out.
 *
 * Two file formats are read. A BERT `vocab.txt` (one token per line, id = line number) gives a
 * WordPiece tokenizer with BERT's basic tokenization in front of it: clean the text (drop NUL,
 * U+FFFD and control characters, map whitespace to ' '), put spaces around CJK ideographs,
 * optionally lower-case (Unicode case mapping) and strip accents (NFD, then drop the combining
 * marks, category Mn), split on whitespace and punctuation (ASCII symbol ranges and Unicode P*),
 * then greedy longest-match-first WordPiece with "##" continuations; a word longer than 100
 * characters, or one that cannot be matched, becomes [UNK]. The result is wrapped as
 * [CLS] ... [SEP]. A Hugging Face `tokenizer.json` (recognised by content: it starts with '{')
 * describes the pipeline itself (normalizer, pre-tokenizer, model, post-processor, truncation);
 * tokenizer_json.c and docs/tokenizers.md list what of it is implemented; for such a file the
 * `lowercase` argument is ignored (the file decides). A construct that is not implemented makes the
 * load fail with a message naming it, so that a tokenizer never silently produces ids different
 * from the reference implementation.
 *
 * A loaded tokenizer is read-only: mts_tokenize may be called from any number of threads at once.
 * Work and memory per call are linear in the text's length (WordPiece: at most 100 characters
 * per word are ever matched; the scratch space is a small multiple of the text's length).
 */
#ifndef MTS_TEXT_TOKENIZER_H
#define MTS_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct mts_tokenizer mts_tokenizer;

/* Loads a BERT vocab.txt (WordPiece, lower-casing per `lowercase`: -1 = auto/from file), a
 * Hugging Face tokenizer.json or a GGUF model's vocabulary (by content, not extension). NULL +
 * message on error. */
mts_tokenizer *mts_tokenizer_load(const char *path, int lowercase, char *err, size_t errlen);
mts_tokenizer *mts_tokenizer_load_mem(const char *data, size_t len, int is_json, int lowercase, char *err, size_t errlen);
/* A WordPiece tokenizer with BERT's pipeline (as for vocab.txt) from a token list: token i
 * (lens[i] bytes of UTF-8, "##" marking continuations) has id i. unk_id, cls_id, sep_id, pad_id:
 * the special tokens' ids, or -1 to look up [UNK], [CLS], [SEP], [PAD] by name. */
mts_tokenizer *mts_tokenizer_wordpiece(const char *const *tokens, const size_t *lens, int n, int64_t unk_id,
                                       int64_t cls_id, int64_t sep_id, int64_t pad_id, int lowercase, char *err,
                                       size_t errlen);
/* The tokenizer a GGUF model file carries in its metadata (tokenizer.ggml.model "bert": WordPiece
 * from tokenizer.ggml.tokens and the special token ids; text/tokenizer_gguf.c). mts_tokenizer_load
 * calls it for a file starting with the GGUF magic. */
mts_tokenizer *mts_tokenizer_load_gguf(const char *path, int lowercase, char *err, size_t errlen);
mts_tokenizer *mts_tokenizer_load_gguf_mem(const void *data, size_t len, int lowercase, char *err, size_t errlen);
void mts_tokenizer_free(mts_tokenizer *t);
/* Encodes one text (UTF-8, len bytes; invalid UTF-8 is an error naming the byte offset) with the
 * special tokens the tokenizer adds ([CLS] ... [SEP] for BERT), truncated to max_tokens (0: the
 * tokenizer's own limit or 512). Writes up to cap ids / type ids (type_ids may be NULL) and
 * returns the number written, or -1 with a message. Thread-safe (a loaded tokenizer is
 * read-only). No padding: callers pad with mts_tokenizer_pad_id.
 * (cap acts as one more truncation limit: a longer encoding is truncated like max_tokens does,
 * keeping the special tokens, so [SEP] is never cut off; a limit below the number of special
 * tokens is an error.) */
int mts_tokenize(const mts_tokenizer *t, const char *text, size_t len, int max_tokens,
                 int64_t *ids, int64_t *type_ids, int cap, char *err, size_t errlen);
int64_t mts_tokenizer_pad_id(const mts_tokenizer *t);
int mts_tokenizer_vocab_size(const mts_tokenizer *t);
const char *mts_tokenizer_kind(const mts_tokenizer *t);   /* "wordpiece", "bpe", "unigram" (or "wordlevel") */

#endif
