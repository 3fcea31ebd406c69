/*
 * Unit tests of the gRPC front end's unpacking without copies (mts__pb_unpack_borrowing in
 * api/grpc_server.c): KServe requests whose raw_input_contents (a repeated byte field) and
 * lip-sync requests whose frame bytes (singular byte fields) stay in the received message. Each
 * case is checked against protobuf-c's own unpacking of the same bytes: the message packs back
 * to the same bytes, every borrowed field lies inside the message and is 4-byte aligned, the
 * copied ones lie outside, a repeated field keeps its order when some occurrences are borrowed
 * and some copied, a singular field given twice keeps the last, and every truncation of a message
 * is refused exactly when protobuf-c refuses it. Runs under ASan (leaks, bad frees) in CI.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/grpc_internal.h"
#include "inference_kserve.pb-c.h"
#include "lipsync.pb-c.h"

static const unsigned raw_fields[] = {7};
static const unsigned lip_fields[] = {2, 3};

/* Packs msg into a fresh buffer at `shift` bytes past a 64-byte boundary (*base: what to free). */
static uint8_t *pack_at(const ProtobufCMessage *msg, size_t shift, size_t *len, uint8_t **base)
{
    *len = protobuf_c_message_get_packed_size(msg);
    *base = aligned_alloc(64, (*len + shift + 64) / 64 * 64);
    assert_non_null(*base);
    protobuf_c_message_pack(msg, *base + shift);
    return *base + shift;
}

/* m packs to exactly `want` (what protobuf-c's own unpacking of the same bytes packs to). */
static void assert_packs_to(const ProtobufCMessage *m, const uint8_t *want, size_t want_len)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    assert_int_equal(n, want_len);
    uint8_t *buf = malloc(n ? n : 1);
    assert_non_null(buf);
    protobuf_c_message_pack(m, buf);
    assert_memory_equal(buf, want, n);
    free(buf);
}

static bool inside(const void *p, const uint8_t *data, size_t len)
{
    return (const uint8_t *)p >= data && (const uint8_t *)p < data + len;
}

/* A ModelInferRequest with n raw inputs of the given byte sizes (contents: a pattern by index). */
static uint8_t *infer_request(const size_t *sizes, int n, size_t shift, size_t *len, uint8_t **base)
{
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in[8], *inp[8];
    ProtobufCBinaryData raw[8];
    int64_t shape[8][1];
    char names[8][8];
    req.model_name = (char *)"m";
    for (int i = 0; i < n; i++) {
        inference__model_infer_request__infer_input_tensor__init(&in[i]);
        snprintf(names[i], sizeof names[i], "in%d", i);
        in[i].name = names[i];
        in[i].datatype = (char *)"UINT8";
        shape[i][0] = (int64_t)sizes[i];
        in[i].shape = shape[i];
        in[i].n_shape = 1;
        inp[i] = &in[i];
        raw[i].len = sizes[i];
        raw[i].data = malloc(sizes[i] ? sizes[i] : 1);
        assert_non_null(raw[i].data);
        for (size_t b = 0; b < sizes[i]; b++) raw[i].data[b] = (uint8_t)(b * 7 + (size_t)i * 31);
    }
    req.inputs = inp;
    req.n_inputs = (size_t)n;
    req.raw_input_contents = raw;
    req.n_raw_input_contents = (size_t)n;
    uint8_t *p = pack_at(&req.base, shift, len, base);
    for (int i = 0; i < n; i++) free(raw[i].data);
    return p;
}

/* Unpacks data both ways and compares; returns how many raw contents were borrowed. */
static int check_infer(uint8_t *data, size_t len)
{
    uint8_t *orig = malloc(len ? len : 1);
    assert_non_null(orig);
    memcpy(orig, data, len);
    Inference__ModelInferRequest *plain = inference__model_infer_request__unpack(NULL, len, orig);
    bool borrowed;
    ProtobufCMessage *bm = mts__pb_unpack_borrowing(&inference__model_infer_request__descriptor, data, len, raw_fields,
                                                    1, sizeof(float), &borrowed);
    assert_true((plain == NULL) == (bm == NULL));
    int n_borrowed = 0;
    if (plain) {
        Inference__ModelInferRequest *m = (Inference__ModelInferRequest *)bm;
        assert_int_equal(m->n_raw_input_contents, plain->n_raw_input_contents);
        for (size_t i = 0; i < m->n_raw_input_contents; i++) {
            const ProtobufCBinaryData *b = &m->raw_input_contents[i];
            assert_int_equal(b->len, plain->raw_input_contents[i].len);
            if (b->len) assert_memory_equal(b->data, plain->raw_input_contents[i].data, b->len);
            if (b->data && inside(b->data, data, len)) {
                n_borrowed++;
                assert_int_equal((uintptr_t)b->data % sizeof(float), 0);
            }
        }
        assert_true(borrowed == (n_borrowed > 0));
        size_t plen = protobuf_c_message_get_packed_size(&plain->base);
        uint8_t *want = malloc(plen ? plen : 1);
        assert_non_null(want);
        protobuf_c_message_pack(&plain->base, want);
        assert_packs_to(bm, want, plen);
        free(want);
        mts__pb_unborrow(bm, raw_fields, 1, data, len);
        protobuf_c_message_free_unpacked(bm, NULL);
        inference__model_infer_request__free_unpacked(plain, NULL);
    }
    free(orig);
    return n_borrowed;
}

static void test_raw_inputs_in_place_at_every_alignment(void **state)
{
    (void)state;
    /* sizes across the 1-, 2- and 3-byte length prefixes, and an empty one */
    static const size_t sizes[] = {4096, 3, 0, 200000, 130, 1, 16384, 70};
    int total = 0;
    for (size_t shift = 0; shift < 8; shift++)
        for (int n = 1; n <= 8; n++) {
            size_t len;
            uint8_t *base, *data = infer_request(sizes, n, shift, &len, &base);
            total += check_infer(data, len);
            free(base);
        }
    assert_true(total > 100); /* most occurrences are read in place */
}

static void test_large_input_is_borrowed(void **state)
{
    (void)state;
    static const size_t sizes[] = {2457600};
    for (size_t shift = 0; shift < 4; shift++) {
        size_t len;
        uint8_t *base, *data = infer_request(sizes, 1, shift, &len, &base);
        assert_int_equal(check_infer(data, len), 1); /* a 4-byte length prefix always has room */
        free(base);
    }
}

static void test_truncations_refused_like_protobuf_c(void **state)
{
    (void)state;
    static const size_t sizes[] = {40, 5, 300};
    size_t len;
    uint8_t *base, *data = infer_request(sizes, 3, 1, &len, &base);
    uint8_t *orig = malloc(len);
    assert_non_null(orig);
    memcpy(orig, data, len);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *buf = malloc(cut ? cut : 1);
        assert_non_null(buf);
        memcpy(buf, orig, cut);
        check_infer(buf, cut);
        free(buf);
    }
    /* flipped bytes: whatever protobuf-c makes of them, the borrowing unpack agrees */
    for (size_t at = 0; at < len; at += 3) {
        memcpy(data, orig, len);
        data[at] ^= 0x80;
        check_infer(data, len);
    }
    free(orig);
    free(base);
}

/* Two InferBatchRequests back to back: protobuf merges them, so each singular byte field keeps
 * the second message's bytes. */
static void test_singular_field_last_wins(void **state)
{
    (void)state;
    for (size_t shift = 0; shift < 4; shift++) {
        Inference__InferBatchRequest a = INFERENCE__INFER_BATCH_REQUEST__INIT, b = INFERENCE__INFER_BATCH_REQUEST__INIT;
        uint8_t va[100], aa[37], vb[5000], ab[12];
        memset(va, 1, sizeof va), memset(aa, 2, sizeof aa), memset(vb, 3, sizeof vb), memset(ab, 4, sizeof ab);
        a.model_id = (char *)"first";
        a.visual_frames = (ProtobufCBinaryData){sizeof va, va};
        a.audio_features = (ProtobufCBinaryData){sizeof aa, aa};
        b.batch_size = 16;
        b.visual_frames = (ProtobufCBinaryData){sizeof vb, vb};
        b.audio_features = (ProtobufCBinaryData){sizeof ab, ab};
        size_t la = protobuf_c_message_get_packed_size(&a.base), lb = protobuf_c_message_get_packed_size(&b.base);
        uint8_t *base = aligned_alloc(64, (la + lb + shift + 64) / 64 * 64), *data = base + shift;
        assert_non_null(base);
        protobuf_c_message_pack(&a.base, data);
        protobuf_c_message_pack(&b.base, data + la);
        size_t len = la + lb;
        Inference__InferBatchRequest *plain = inference__infer_batch_request__unpack(NULL, len, data);
        assert_non_null(plain);
        bool borrowed;
        Inference__InferBatchRequest *m = (Inference__InferBatchRequest *)mts__pb_unpack_borrowing(
            &inference__infer_batch_request__descriptor, data, len, lip_fields, 2, sizeof(float), &borrowed);
        assert_non_null(m);
        assert_string_equal(m->model_id, "first");
        assert_int_equal(m->batch_size, 16);
        assert_int_equal(m->visual_frames.len, sizeof vb);
        assert_memory_equal(m->visual_frames.data, vb, sizeof vb);
        assert_int_equal(m->audio_features.len, sizeof ab);
        assert_memory_equal(m->audio_features.data, ab, sizeof ab);
        assert_true(borrowed);
        assert_true(inside(m->visual_frames.data, data, len)); /* 2-byte prefix: room for any shift */
        assert_int_equal((uintptr_t)m->visual_frames.data % 4, 0);
        /* a copy for the fields protobuf-c had to copy; the message outlives the bytes once owned */
        assert_int_equal(mts__pb_own_borrowed(&m->base, lip_fields, 2, data, len), 0);
        assert_false(inside(m->visual_frames.data, data, len));
        assert_false(inside(m->audio_features.data, data, len));
        memset(base, 0xee, la + lb + shift);
        assert_memory_equal(m->visual_frames.data, vb, sizeof vb);
        assert_memory_equal(m->audio_features.data, ab, sizeof ab);
        mts__pb_unborrow(&m->base, lip_fields, 2, data, len); /* nothing left to detach */
        inference__infer_batch_request__free_unpacked(m, NULL);
        inference__infer_batch_request__free_unpacked(plain, NULL);
        free(base);
    }
}

/* A message without the listed fields is unpacked as protobuf-c does, and nothing is borrowed. */
static void test_nothing_to_borrow(void **state)
{
    (void)state;
    Inference__InferBatchRequest a = INFERENCE__INFER_BATCH_REQUEST__INIT;
    a.model_id = (char *)"w8";
    a.batch_size = 4;
    size_t len;
    uint8_t *base, *data = pack_at(&a.base, 3, &len, &base);
    bool borrowed = true;
    Inference__InferBatchRequest *m = (Inference__InferBatchRequest *)mts__pb_unpack_borrowing(
        &inference__infer_batch_request__descriptor, data, len, lip_fields, 2, sizeof(float), &borrowed);
    assert_non_null(m);
    assert_false(borrowed);
    assert_string_equal(m->model_id, "w8");
    assert_null(m->visual_frames.data);
    inference__infer_batch_request__free_unpacked(m, NULL);
    free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raw_inputs_in_place_at_every_alignment),
        cmocka_unit_test(test_large_input_is_borrowed),
        cmocka_unit_test(test_truncations_refused_like_protobuf_c),
        cmocka_unit_test(test_singular_field_last_wins),
        cmocka_unit_test(test_nothing_to_borrow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
