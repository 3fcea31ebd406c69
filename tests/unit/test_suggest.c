/*
 * Unit tests of the edit distance and the "did you mean" suggestion (util/suggest.h): the
 * distance of inserts, deletes, substitutions and adjacent swaps, and which misspellings get
 * a suggestion and which are too far from every known name to get one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "util/suggest.h"

static void test_distance(void **state)
{
    (void)state;
    assert_int_equal(mts_edit_distance("", ""), 0);
    assert_int_equal(mts_edit_distance("abc", ""), 3);
    assert_int_equal(mts_edit_distance("", "abc"), 3);
    assert_int_equal(mts_edit_distance("max_batch", "max_batch"), 0);
    assert_int_equal(mts_edit_distance("max_bacth", "max_batch"), 1); /* swap */
    assert_int_equal(mts_edit_distance("max_btch", "max_batch"), 1);  /* insert */
    assert_int_equal(mts_edit_distance("max_batchh", "max_batch"), 1);/* delete */
    assert_int_equal(mts_edit_distance("max_betch", "max_batch"), 1); /* substitute */
    assert_int_equal(mts_edit_distance("kitten", "sitting"), 3);
    assert_int_equal(mts_edit_distance("ab", "ba"), 1);
    char longer[200];
    memset(longer, 'a', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    assert_true(mts_edit_distance(longer, "a") > 1000); /* over the length limit */
}

static void test_suggest(void **state)
{
    (void)state;
    static const char *const keys[] = {"max_batch", "max_queue_delay_us", "queue_size", "preload", "pin",
                                       "instances"};
    size_t n = sizeof keys / sizeof keys[0];
    assert_string_equal(mts_suggest("max_bacth", keys, n), "max_batch");
    assert_string_equal(mts_suggest("queue_sise", keys, n), "queue_size");
    assert_string_equal(mts_suggest("preloda", keys, n), "preload");
    assert_string_equal(mts_suggest("max_queue_delay_ms", keys, n), "max_queue_delay_us");
    assert_string_equal(mts_suggest("instance", keys, n), "instances");
    assert_null(mts_suggest("colour", keys, n));
    assert_null(mts_suggest("tracing", keys, n));
    assert_null(mts_suggest("x", keys, n)); /* too short to be a typo of anything */
    assert_null(mts_suggest("", keys, n));
    assert_null(mts_suggest("max_batch", keys, 0));
    static const char *const opts[] = {"--http-port", "--grpc-port", "--host"};
    assert_string_equal(mts_suggest("--http-prot", opts, 3), "--http-port");
    assert_string_equal(mts_suggest("--grpc_port", opts, 3), "--grpc-port");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distance),
        cmocka_unit_test(test_suggest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
