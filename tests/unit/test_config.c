/*
 * Unit tests of the configuration loader: the config.yaml examples the supported deployments publish
 * (verbatim apart from model paths) and their smaller snippets, defaults and derived values
 * after finalize, port forms, relative path resolution, anchors, the model repository scan
 * (with per-folder config.yaml), one test per error class checking the file:line and key in the
 * message, size and nesting limits, and that each unknown or inapplicable key warns exactly once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "config/pbtxt.h"

/* ---- warning capture ---- */

typedef struct warns {
    int n;
    char msg[16][MTS_ERR_MSG_MAX];
} warns;

static void on_warn(void *user, const char *msg)
{
    warns *w = user;
    if (w->n < 16) snprintf(w->msg[w->n], sizeof w->msg[w->n], "%s", msg);
    w->n++;
}

static int count_warns(const warns *w, const char *needle)
{
    int k = 0;
    for (int i = 0; i < w->n && i < 16; i++)
        if (strstr(w->msg[i], needle)) k++;
    return k;
}

static int parse(const char *text, const char *name, mts_config *c, warns *w, mts_err *err)
{
    return mts_config_parse_yaml(text, strlen(text), name, c, on_warn, w, err);
}

/* Expects text to fail with code; the message must hold every needle. */
static void expect_error(const char *text, int code, const char *n1, const char *n2)
{
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    int rc = parse(text, "t.yaml", &c, &w, &err);
    if (rc != code || (n1 && !strstr(err.msg, n1)) || (n2 && !strstr(err.msg, n2)))
        fail_msg("for:\n%s\ngot rc %d, message: %s\nwanted rc %d with '%s' and '%s'", text, rc, err.msg, code,
                 n1 ? n1 : "", n2 ? n2 : "");
    mts_config_free(&c); /* already freed by the failed parse; must be harmless */
}

/* ---- published deployment configurations ---- */

/* The lip-sync server's parallel-workers configuration, verbatim. */
static const char *seed000 =
    "server:\n"
    "  port: \":50051\"\n"
    "  max_message_size_mb: 50\n"
    "  worker_count: 4              # Parallel workers (4-8 recommended)\n"
    "  queue_size: 100              # Request queue depth\n"
    "\n"
    "capacity:\n"
    "  max_models: 80               # For 96GB GPU (with safety margin)\n"
    "  max_memory_gb: 90            # GPU memory limit\n"
    "  eviction_policy: \"lfu\"       # LRU or LFU\n"
    "  idle_timeout_minutes: 30\n"
    "  background_cache_frames: 50  # LRU cache size per model\n";

/* The lip-sync server's migration example, verbatim except the model paths. */
static const char *seed001 =
    "server:\n"
    "  port: \":50051\"\n"
    "  max_message_size_mb: 50\n"
    "  worker_count: 4              # Adjust based on GPU/CPU\n"
    "  queue_size: 100\n"
    "\n"
    "capacity:\n"
    "  max_models: 80               # For 96GB GPU\n"
    "  max_memory_gb: 90\n"
    "  eviction_policy: \"lfu\"       # or \"lru\"\n"
    "  idle_timeout_minutes: 30\n"
    "  background_cache_frames: 50  # Cache size per model\n"
    "\n"
    "models:\n"
    "  sanders:\n"
    "    model_path: \"/data/model/unet_328.onnx\"\n"
    "    background_dir: \"/data/model_videos/sanders/background\"\n"
    "    crop_rects_path: \"/data/model_videos/sanders/crop_rects.json\"\n"
    "    num_frames: 2000\n"
    "    preload: false             # Don't preload (use lazy loading)\n"
    "    \n"
    "  bob:\n"
    "    model_path: \"/data/model/unet_328.onnx\"\n"
    "    background_dir: \"/data/model_videos/bob/background\"\n"
    "    crop_rects_path: \"/data/model_videos/bob/crop_rects.json\"\n"
    "    num_frames: 2000\n"
    "    preload: false\n"
    "\n"
    "# Add more models as needed\n";

/* The multi-GPU inference server's example, verbatim (its model path is relative already). */
static const char *seed002 =
    "server:\n"
    "  port: \":50051\"\n"
    "  worker_count_per_gpu: 4\n"
    "\n"
    "gpus:\n"
    "  count: 8              # Your GPU count\n"
    "  memory_gb_per_gpu: 96\n"
    "\n"
    "capacity:\n"
    "  max_models: 1200\n"
    "  max_memory_gb: 720\n"
    "\n"
    "onnx:\n"
    "  library_path: \"C:/onnxruntime-win-x64-gpu-1.21.0/lib/onnxruntime.dll\"\n"
    "\n"
    "models:\n"
    "  sanders:\n"
    "    model_path: \"path/to/unet_328.onnx\"\n"
    "    preload: false\n";

static void test_seed000(void **state)
{
    (void)state;
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    assert_int_equal(parse(seed000, "config.yaml", &c, &w, &err), MTS_OK);
    assert_int_equal(w.n, 0);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.grpc_port, 50051);
    assert_int_equal(c.http_port, 8000);
    assert_int_equal(c.max_message_size_mb, 50);
    assert_int_equal(c.worker_count, 4);
    assert_int_equal(c.queue_size, 100);
    assert_int_equal(c.max_models, 80);
    assert_true(c.max_memory_gb == 90.0);
    assert_int_equal(c.eviction, MTS_EVICT_LFU);
    assert_true(c.idle_timeout_minutes == 30.0);
    assert_int_equal(c.background_cache_frames, 50);
    assert_int_equal(c.n_models, 0);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    assert_int_equal(c.device_count, 1);
    assert_int_equal(c.workers_per_device, 4);
    assert_true(c.memory_gb_per_device == 90.0);
    assert_int_equal(c.max_queue_total, 1600);
    assert_true(c.threads_per_device >= 1);
    assert_int_equal(c.shutdown_grace_s, 30);
    assert_int_equal(c.placement, MTS_PLACE_ROUND_ROBIN);
    mts_config_free(&c);
}

static void test_seed001(void **state)
{
    (void)state;
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    assert_int_equal(parse(seed001, "config.yaml", &c, &w, &err), MTS_OK);
    assert_int_equal(w.n, 0);
    assert_int_equal(c.n_models, 2);
    assert_string_equal(c.models[0].name, "sanders");
    assert_string_equal(c.models[1].name, "bob");
    const mts_model_config *m = mts_config_find_model(&c, "bob");
    assert_non_null(m);
    assert_string_equal(m->model_path, "/data/model/unet_328.onnx");
    assert_string_equal(m->background_dir, "/data/model_videos/bob/background");
    assert_string_equal(m->crop_rects_path, "/data/model_videos/bob/crop_rects.json");
    assert_int_equal(m->num_frames, 2000);
    assert_false(m->preload);
    assert_null(mts_config_find_model(&c, "alice"));
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    for (int i = 0; i < 2; i++) {
        m = &c.models[i];
        assert_int_equal(m->max_batch, 8);
        assert_int_equal(m->max_queue_delay_us, 2000);
        assert_int_equal(m->queue_size, 100);
        assert_int_equal(m->instances, 4);
        assert_int_equal(m->preferred_device, -1);
        assert_int_equal(m->background_cache_frames, 50);
        assert_false(m->pin);
    }
    mts_config_free(&c);
}

static void test_seed002(void **state)
{
    (void)state;
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    assert_int_equal(parse(seed002, "/etc/mtserve/config.yaml", &c, &w, &err), MTS_OK);
    assert_int_equal(w.n, 1);
    assert_string_equal(w.msg[0], "/etc/mtserve/config.yaml:14: key 'onnx.library_path' does not apply to mtserve "
                                  "(it has its own engine); ignored");
    assert_int_equal(c.grpc_port, 50051);
    assert_int_equal(c.device_count, 8);
    assert_int_equal(c.max_models, 1200);
    assert_int_equal(c.n_models, 1);
    /* relative paths are resolved against the file's folder */
    assert_string_equal(c.models[0].model_path, "/etc/mtserve/path/to/unet_328.onnx");
    assert_string_equal(c.source, "/etc/mtserve/config.yaml");
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    assert_int_equal(c.workers_per_device, 4);
    assert_true(c.memory_gb_per_device == 96.0); /* a budget, not checked against the machine */
    assert_true(c.max_memory_gb == 720.0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(c.threads_per_device, cores / 8 < 1 ? 1 : cores / 8);
    assert_int_equal(c.models[0].instances, 4);
    mts_config_free(&c);
}

/* The smaller snippets of the same documents must load too. */
static void test_seed_snippets(void **state)
{
    (void)state;
    static const char *snippets[] = {
        "server:\n  worker_count: 4  # Adjust this value\n",
        "capacity:\n  background_cache_frames: 50  # Adjust this value\n",
        "server:\n  queue_size: 100  # Adjust this value\n",
        "capacity:\n  max_models: 80  # Adjust this value\n  max_memory_gb: 90\n",
        "server:\n  port: \":50051\"\n",
        "server:\n  port: \":50052\"  # Different port\n",
        "models:\n  sanders:\n    model_path: \"path/to/model.onnx\"\n    background_dir: \"path/to/backgrounds\"\n"
        "    crop_rects_path: \"path/to/crop_rects.json\"\n    num_frames: 2000\n    preload: false\n",
        "capacity:\n  max_models: 60  # Reduce from 80\n  eviction_policy: \"lfu\"  # Enable automatic eviction\n",
        "server:\n  worker_count: 8     # More workers\n  queue_size: 200     # Larger queue\n",
        "gpus:\n  assignment_strategy: \"round-robin\"  # Options: round-robin, least-loaded\n",
        "capacity:\n  eviction_policy: \"lfu\"  # Options: lru, lfu\n",
        "models:\n  important_model:\n    preferred_gpu: 0  # Force GPU 0 (-1 = auto)\n    model_path: m.onnx\n",
        "capacity:\n  max_models: 800  # Reduce from 1200\n  idle_timeout_minutes: 30  # Evict after 30 min idle\n",
        "gpus:\n  assignment_strategy: \"least-loaded\"\n",
    };
    for (size_t i = 0; i < sizeof snippets / sizeof *snippets; i++) {
        mts_config c;
        warns w = {0};
        mts_err err = {0};
        int rc = parse(snippets[i], "config.yaml", &c, &w, &err);
        if (rc != MTS_OK) fail_msg("snippet %zu: %s", i, err.msg);
        assert_int_equal(w.n, 0);
        assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
        mts_config_free(&c);
    }
    /* The ONNX snippet warns once. */
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    assert_int_equal(parse("onnx:\n  library_path: \"C:/onnxruntime-win-x64-gpu-1.21.0/lib/onnxruntime.dll\"\n",
                           "config.yaml", &c, &w, &err),
                     MTS_OK);
    assert_int_equal(w.n, 1);
    mts_config_free(&c);
}

static void test_values_and_forms(void **state)
{
    (void)state;
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    const char *y = "server:\n"
                    "  port: \"0.0.0.0:6000\"\n"
                    "  http_port: 8080\n"
                    "  default_timeout_ms: 1500\n"
                    "  shutdown_grace_s: 5\n"
                    "  max_queue_total: 77\n"
                    "gpus:\n"
                    "  count: 2\n"
                    "  threads_per_gpu: 3\n"
                    "  assignment_strategy: Least-Loaded\n"
                    "capacity:\n"
                    "  eviction_policy: LRU\n"
                    "  max_memory_gb: 10\n"
                    "  background_cache_frames: 7\n"
                    "model_repository: repo\n"
                    "models:\n"
                    "  base: &base {model_path: a.onnx, max_batch: 4, pin: yes}\n"
                    "  copy: *base\n"
                    "  m2:\n"
                    "    model_path: ./sub/b.onnx\n"
                    "    max_queue_delay_ms: 2.5\n"
                    "    preferred_gpu: 1\n"
                    "    instances: 3\n"
                    "    weight: 2.5\n"
                    "    priority: 2\n"
                    "    queue_size: 9\n"
                    "    background_cache_frames: 0\n";
    assert_int_equal(parse(y, "cfg/x.yaml", &c, &w, &err), MTS_OK);
    assert_int_equal(w.n, 0);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.grpc_port, 6000);
    assert_int_equal(c.http_port, 8080);
    assert_int_equal(c.default_timeout_ms, 1500);
    assert_int_equal(c.shutdown_grace_s, 5);
    assert_int_equal(c.placement, MTS_PLACE_LEAST_LOADED);
    assert_int_equal(c.eviction, MTS_EVICT_LRU);
    assert_string_equal(c.model_repository, "cfg/repo");
    assert_int_equal(c.n_models, 3);
    assert_string_equal(c.models[0].model_path, "cfg/a.onnx");
    assert_string_equal(c.models[1].model_path, "cfg/a.onnx");
    assert_int_equal(c.models[1].max_batch, 4);
    assert_true(c.models[1].pin);
    assert_string_equal(c.models[2].model_path, "cfg/sub/b.onnx");
    assert_int_equal(c.models[2].max_queue_delay_us, 2500);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    assert_int_equal(c.threads_per_device, 3);
    assert_true(c.memory_gb_per_device == 5.0);
    assert_int_equal(c.workers_per_device, 2);
    assert_int_equal(c.max_queue_total, 77);
    assert_int_equal(c.models[2].preferred_device, 1);
    assert_int_equal(c.models[2].instances, 3);
    assert_int_equal(c.models[2].queue_size, 9);
    assert_int_equal(c.models[2].background_cache_frames, 0);
    assert_int_equal(c.models[0].background_cache_frames, 7);
    assert_int_equal(c.models[0].instances, 2);
    assert_true(c.models[2].weight == 2.5 && c.models[2].priority == 2);
    assert_true(c.models[0].weight == 1.0 && c.models[0].priority == MTS_DEFAULT_PRIORITY);
    mts_config_free(&c);

    /* Port forms; server.host wins over the host in server.port. */
    assert_int_equal(parse("server:\n  port: 50052\n", "x", &c, &w, &err), MTS_OK);
    assert_int_equal(c.grpc_port, 50052);
    assert_string_equal(c.host, "127.0.0.1");
    mts_config_free(&c);
    assert_int_equal(parse("server:\n  port: \"[::1]:7000\"\n", "x", &c, &w, &err), MTS_OK);
    assert_string_equal(c.host, "::1");
    assert_int_equal(c.grpc_port, 7000);
    mts_config_free(&c);
    assert_int_equal(parse("server:\n  host: 10.0.0.1\n  port: 1.2.3.4:7001\n", "x", &c, &w, &err), MTS_OK);
    assert_string_equal(c.host, "10.0.0.1");
    assert_int_equal(c.grpc_port, 7001);
    mts_config_free(&c);

    /* The gRPC transport: native or core; unset leaves it to the environment (NULL). */
    assert_int_equal(parse("server:\n  grpc_transport: core\n", "x", &c, &w, &err), MTS_OK);
    assert_string_equal(c.grpc_transport, "core");
    mts_config_free(&c);
    assert_int_equal(parse("server:\n  port: 7002\n", "x", &c, &w, &err), MTS_OK);
    assert_null(c.grpc_transport);
    mts_config_free(&c);
    assert_int_not_equal(parse("server:\n  grpc_transport: quic\n", "x", &c, &w, &err), MTS_OK);
    assert_non_null(strstr(err.msg, "grpc_transport"));
    mts_config_free(&c);

    /* light_io_realtime: a bool; unset (-1) leaves it to the environment (on unless "0"). */
    assert_int_equal(parse("server:\n  light_io_realtime: false\n", "x", &c, &w, &err), MTS_OK);
    assert_int_equal(c.light_io_realtime, 0);
    mts_config_free(&c);
    assert_int_equal(parse("server:\n  light_io_realtime: yes\n", "x", &c, &w, &err), MTS_OK);
    assert_int_equal(c.light_io_realtime, 1);
    mts_config_free(&c);
    assert_int_equal(parse("server:\n  port: 7003\n", "x", &c, &w, &err), MTS_OK);
    assert_int_equal(c.light_io_realtime, -1);
    mts_config_free(&c);
    assert_int_not_equal(parse("server:\n  light_io_realtime: 2\n", "x", &c, &w, &err), MTS_OK);
    assert_non_null(strstr(err.msg, "light_io_realtime"));
    mts_config_free(&c);

    /* Empty and comment-only files give the defaults; defaults derive max_memory_gb from RAM. */
    assert_int_equal(parse("", "x", &c, &w, &err), MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    assert_true(c.max_memory_gb > 0);
    assert_true(c.memory_gb_per_device == c.max_memory_gb);
    assert_int_equal(c.max_queue_total, 1600);
    assert_int_equal(c.workers_per_device, 2);
    mts_config_free(&c);
    assert_int_equal(parse("# nothing\nserver:\nmodels:\n", "x", &c, &w, &err), MTS_OK);
    assert_int_equal(c.n_models, 0);
    mts_config_free(&c);
    assert_int_equal(w.n, 0);

    /* server.worker_count feeds workers_per_device when gpus is absent; per-gpu wins. */
    assert_int_equal(parse("server:\n  worker_count: 3\ngpus:\n  worker_count_per_gpu: 5\n", "x", &c, &w, &err),
                     MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    assert_int_equal(c.workers_per_device, 5);
    mts_config_free(&c);
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("capacity:\n  max_models: abc\n", MTS_EINVAL,
                 "t.yaml:2: key 'capacity.max_models': expected a positive integer, got 'abc'", NULL);
    expect_error("server:\n  queue_size: -5\n", MTS_EINVAL,
                 "t.yaml:2: key 'server.queue_size': expected a positive integer, got '-5'", NULL);
    expect_error("capacity:\n  max_models: 0\n", MTS_EINVAL, "t.yaml:2: key 'capacity.max_models'", "got '0'");
    expect_error("models:\n  a:\n    model_path: a.onnx\n    weight: 0\n", MTS_EINVAL, "t.yaml:4: key 'models.a.weight'",
                 "positive number");
    expect_error("models:\n  a:\n    model_path: a.onnx\n    priority: 10\n", MTS_EINVAL,
                 "t.yaml:4: key 'models.a.priority'", "10");
    expect_error("gpus:\n\n  count: 99999999999999999999999\n", MTS_EINVAL, "t.yaml:3: key 'gpus.count'",
                 "positive integer");
    expect_error("gpus:\n  count: 5000\n", MTS_EINVAL, "t.yaml:2: key 'gpus.count'", "no larger than 1024");
    expect_error("server:\n  port: \":70000\"\n", MTS_EINVAL, "t.yaml:2: key 'server.port'", "65535");
    expect_error("server:\n  port: \"localhost\"\n", MTS_EINVAL, "t.yaml:2: key 'server.port'", "'localhost'");
    expect_error("capacity:\n  eviction_policy: mru\n", MTS_EINVAL, "t.yaml:2: key 'capacity.eviction_policy'",
                 "expected one of 'lru', 'lfu', got 'mru'");
    expect_error("gpus:\n  assignment_strategy: random\n", MTS_EINVAL, "key 'gpus.assignment_strategy'",
                 "'round-robin', 'least-loaded'");
    expect_error("capacity:\n  max_memory_gb: -3\n", MTS_EINVAL, "t.yaml:2: key 'capacity.max_memory_gb'",
                 "expected a positive number, got '-3'");
    expect_error("capacity:\n  idle_timeout_minutes: soon\n", MTS_EINVAL, "key 'capacity.idle_timeout_minutes'",
                 "non-negative number");
    expect_error("models:\n  a:\n    model_path: a.onnx\n    preload: maybe\n", MTS_EINVAL,
                 "t.yaml:4: key 'models.a.preload': expected true or false, got 'maybe'", NULL);
    expect_error("models:\n  a:\n    model_path: a.onnx\n    max_batch: -1\n", MTS_EINVAL,
                 "t.yaml:4: key 'models.a.max_batch'", NULL);
    expect_error("models:\n  a:\n    model_path: a.onnx\n    preferred_gpu: -2\n", MTS_EINVAL,
                 "t.yaml:4: key 'models.a.preferred_gpu'", "from -1 to 1023");
    expect_error("models:\n  a:\n    num_frames: 10\n", MTS_EINVAL, "t.yaml:2: key 'models.a'", "no model_path");
    expect_error("models:\n  a:\n", MTS_EINVAL, "t.yaml:2: key 'models.a'", "no model_path");
    expect_error("models:\n  a:\n    model_path: a.onnx\n    precision: fp8\n", MTS_EINVAL,
                 "t.yaml:4: key 'models.a.precision'", "'auto', 'fp32', 'bf16', 'int8', 'fp16', got 'fp8'");
    expect_error("models:\n  a:\n    model_path: a.onnx\n    max_error: 0\n", MTS_EINVAL,
                 "t.yaml:4: key 'models.a.max_error'", "positive number");
    {
        mts_config c;
        warns w = {0};
        mts_err err = {0};
        assert_int_equal(parse("models:\n  a:\n    model_path: a.onnx\n    precision: BF16\n    max_error: 0.02\n"
                               "    engine_batch: 8\n",
                               "t.yaml", &c, &w, &err), MTS_OK);
        assert_string_equal(c.models[0].precision, "bf16");
        assert_true(c.models[0].max_error == 0.02);
        assert_int_equal(c.models[0].engine_batch, 8);
        mts_config_free(&c);
        assert_int_equal(parse("models:\n  a:\n    model_path: a.onnx\n    precision: fp16\n", "t.yaml", &c, &w, &err),
                         MTS_OK);
        assert_string_equal(c.models[0].precision, "fp16");
        mts_config_free(&c);
    }
    expect_error("models:\n  a:\n    model_path: a.onnx\n    engine_batch: -1\n", MTS_EINVAL,
                 "t.yaml:4: key 'models.a.engine_batch'", NULL);
    expect_error("models:\n  a:\n    model_path: \"\"\n", MTS_EINVAL, "t.yaml:3: key 'models.a.model_path'",
                 "non-empty string");
    expect_error("models:\n  a:\n    model_path: x\n  b:\n    model_path: y\n  a:\n    model_path: z\n", MTS_EINVAL,
                 "t.yaml:6: key 'models.a': given twice (first at line 2)", NULL);
    expect_error("server:\n  queue_size: 1\n  queue_size: 2\n", MTS_EINVAL, "t.yaml:3: key 'server.queue_size'",
                 "given twice");
    expect_error("models:\n  bad name:\n    model_path: x\n", MTS_EINVAL, "t.yaml:2: key 'models.bad name'",
                 "model name");
    expect_error("models:\n  a: 5\n", MTS_EINVAL, "t.yaml:2: key 'models.a'", "expected a mapping");
    expect_error("server: 5\n", MTS_EINVAL, "t.yaml:1: key 'server': expected a mapping", "got '5'");
    expect_error("x: 1\ncapacity:\n  - 1\n", MTS_EINVAL, "t.yaml:3: key 'capacity'", "got a sequence");
    expect_error("models:\n  - a\n  - b\n", MTS_EINVAL, "t.yaml:2: key 'models'", "got a sequence");
    expect_error("- 1\n- 2\n", MTS_EINVAL, "t.yaml:1: the top level must be a mapping", "got a sequence");
    expect_error("server:\n  port: [1, 2]\n", MTS_EINVAL, "t.yaml:2: key 'server.port'", "got a sequence");
    expect_error("models:\n  a:\n    model_path: a\n    max_queue_delay_us: 10\n    max_queue_delay_ms: 1\n",
                 MTS_EINVAL, "t.yaml:5: key 'models.a.max_queue_delay_ms'", "conflicts");
    expect_error("server:\n  port: 1\n bad indent: 2\n", MTS_EINVAL, "t.yaml:3: YAML syntax error", NULL);
    expect_error("server:\n  port: \"unterminated\n", MTS_EINVAL, "t.yaml:", "YAML syntax error");
    expect_error("server:\n\tport: 1\n", MTS_EINVAL, "t.yaml:2: YAML syntax error", "tabs cannot indent");
    expect_error("server:\n  port: 1\n---\nserver: {}\n", MTS_EINVAL, "t.yaml:3:", "second YAML document");
    expect_error("models:\n  a: *nothing\n", MTS_EINVAL, "t.yaml:2:", "alias '*nothing'");
    expect_error("? [a, b]\n: 1\n", MTS_EINVAL, "t.yaml:1:", "keys must be plain names");
}

static void test_limits(void **state)
{
    (void)state;
    /* Nesting. */
    size_t depth = 200;
    char *deep = malloc(2 * depth + 16);
    size_t o = 0;
    o += (size_t)sprintf(deep, "x: ");
    for (size_t i = 0; i < depth; i++) deep[o++] = '[';
    for (size_t i = 0; i < depth; i++) deep[o++] = ']';
    deep[o++] = '\n';
    deep[o] = '\0';
    expect_error(deep, MTS_ELIMIT, "t.yaml:1:", "nesting is deeper than 64");
    free(deep);
    /* Size: parse_yaml and load_yaml. */
    size_t big = ((size_t)4 << 20) + 10;
    char *text = malloc(big + 1);
    memset(text, '#', big);
    text[big] = '\0';
    mts_config c;
    mts_err err = {0};
    assert_int_equal(mts_config_parse_yaml(text, big, "big.yaml", &c, NULL, NULL, &err), MTS_ELIMIT);
    assert_non_null(strstr(err.msg, "4 MiB"));
    char path[] = "/tmp/mts_cfg_big_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, big), (ssize_t)big);
    close(fd);
    assert_int_equal(mts_config_load_yaml(path, &c, NULL, NULL, &err), MTS_ELIMIT);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "4 MiB"));
    unlink(path);
    free(text);
    assert_int_equal(mts_config_load_yaml("/nonexistent/mts.yaml", &c, NULL, NULL, &err), MTS_ENOTFOUND);
    assert_non_null(strstr(err.msg, "/nonexistent/mts.yaml"));
    mts_config_free(&c);
}

static void test_finalize_errors(void **state)
{
    (void)state;
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    assert_int_equal(parse("gpus:\n  count: 2\nmodels:\n  face:\n    model_path: f.onnx\n    preferred_gpu: 2\n",
                           "conf.yaml", &c, &w, &err),
                     MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "conf.yaml"));
    assert_non_null(strstr(err.msg, "model 'face'"));
    assert_non_null(strstr(err.msg, "preferred_gpu 2"));
    mts_config_free(&c);
    assert_int_equal(parse("capacity:\n  max_models: 1\nmodels:\n  a: {model_path: a, pin: true}\n"
                           "  b: {model_path: b, pin: true}\n",
                           "conf.yaml", &c, &w, &err),
                     MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "max_models"));
    mts_config_free(&c);
    /* TLS files come in pairs; a client CA needs both; paths resolve against the file's folder */
    assert_int_equal(parse("server:\n  tls_cert_path: cert.pem\n", "/etc/m/conf.yaml", &c, &w, &err), MTS_OK);
    assert_string_equal(c.tls_cert_path, "/etc/m/cert.pem");
    assert_int_equal(mts_config_finalize(&c, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "tls_cert_path and server.tls_key_path go together (got only tls_cert_path)"));
    mts_config_free(&c);
    assert_int_equal(parse("server:\n  tls_client_ca_path: ca.pem\n", "conf.yaml", &c, &w, &err), MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "tls_client_ca_path needs"));
    mts_config_free(&c);
    assert_int_equal(parse("server:\n  tls_cert_path: c.pem\n  tls_key_path: k.pem\n", "conf.yaml", &c, &w, &err),
                     MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    mts_config_free(&c);
}

/* A fake environment for mts_config_apply_env. */
static const char *fake_env[8][2];

static const char *fake_getenv(const char *name)
{
    for (int i = 0; i < 8 && fake_env[i][0]; i++)
        if (!strcmp(fake_env[i][0], name)) return fake_env[i][1];
    return NULL;
}

static void set_env(const char *a, const char *av, const char *b, const char *bv)
{
    memset(fake_env, 0, sizeof fake_env);
    fake_env[0][0] = a, fake_env[0][1] = av;
    fake_env[1][0] = b, fake_env[1][1] = bv;
}

/* The ML service's environment variables: ML_INFERENCE_WORKERS, ML_MEMORY_LIMIT_GB,
 * ML_CONCURRENT_MODELS, ML_ENABLE_PARALLEL_INFERENCE over the file's values; bad values name the variable. */
static void test_ml_service_env(void **state)
{
    (void)state;
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    assert_int_equal(parse(seed002, "seed002.yaml", &c, &w, &err), MTS_OK);
    memset(fake_env, 0, sizeof fake_env);
    fake_env[0][0] = "ML_INFERENCE_WORKERS", fake_env[0][1] = "4";
    fake_env[1][0] = "ML_MEMORY_LIMIT_GB", fake_env[1][1] = "6";
    fake_env[2][0] = "ML_CONCURRENT_MODELS", fake_env[2][1] = "3";
    fake_env[3][0] = "ML_ENABLE_PARALLEL_INFERENCE", fake_env[3][1] = "false";
    warns notes = {0};
    assert_int_equal(mts_config_apply_env(&c, fake_getenv, on_warn, &notes, &err), MTS_OK);
    assert_int_equal(notes.n, 4);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    assert_int_equal(c.workers_per_device, 4);
    assert_int_equal(c.max_models, 3);
    assert_true(fabs(c.max_memory_gb - 6) < 1e-9);
    assert_true(fabs(c.memory_gb_per_device - 6.0 / 8) < 1e-9); /* the file's 96 GB per GPU is lowered */
    assert_int_equal(c.models[0].instances, 1);                  /* parallel inference off */
    mts_config_free(&c);
    /* absent variables change nothing; "true" keeps the default instances */
    assert_int_equal(parse(seed002, "seed002.yaml", &c, &w, &err), MTS_OK);
    set_env("ML_ENABLE_PARALLEL_INFERENCE", "TRUE", NULL, NULL);
    assert_int_equal(mts_config_apply_env(&c, fake_getenv, NULL, NULL, &err), MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    assert_int_equal(c.max_models, 1200);
    assert_int_equal(c.models[0].instances, 4);
    mts_config_free(&c);
    static const char *bad[][3] = {{"ML_INFERENCE_WORKERS", "four", "expected an integer 1..256"},
                                   {"ML_INFERENCE_WORKERS", "0", "expected an integer 1..256"},
                                   {"ML_MEMORY_LIMIT_GB", "-1", "expected a number of GB"},
                                   {"ML_CONCURRENT_MODELS", "3x", "expected an integer"},
                                   {"ML_ENABLE_PARALLEL_INFERENCE", "maybe", "expected true or false"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(parse(seed002, "seed002.yaml", &c, &w, &err), MTS_OK);
        set_env(bad[i][0], bad[i][1], NULL, NULL);
        assert_int_equal(mts_config_apply_env(&c, fake_getenv, NULL, NULL, &err), MTS_EINVAL);
        assert_non_null(strstr(err.msg, bad[i][0]));
        assert_non_null(strstr(err.msg, bad[i][2]));
        mts_config_free(&c);
    }
}

static void write_file(const char *path, const char *text);

/* Triton's config.pbtxt: the text format, the fields mtserve maps, errors with file and line, and
 * every truncation of a real-looking file parsing or failing cleanly. */
static const char *triton_pbtxt =
    "name: \"seg\"\n"
    "platform: \"onnxruntime_onnx\"  # the ONNX Runtime backend\n"
    "max_batch_size: 16\n"
    "version_policy: { latest { num_versions: 1 } }\n"
    "input [\n"
    "  { name: \"image\" data_type: TYPE_FP32 dims: [ 3, 256, 256 ] }\n"
    "]\n"
    "output [ { name: \"mask\", data_type: TYPE_FP32, dims: [1, 256, 256] } ]\n"
    "dynamic_batching {\n"
    "  preferred_batch_size: [ 4, 8 ]\n"
    "  max_queue_delay_microseconds: 500\n"
    "}\n"
    "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] }, { kind: KIND_CPU } ]\n"
    "model_warmup [ { name: 'w' batch_size: 1 } ]\n";

static void test_triton_pbtxt(void **state)
{
    (void)state;
    mts_pbtxt root;
    mts_err err = {0};
    assert_int_equal(mts_pbtxt_parse(triton_pbtxt, strlen(triton_pbtxt), "config.pbtxt", &root, &err), MTS_OK);
    assert_string_equal(mts_pbtxt_get(&root, "name")->scalar, "seg");
    assert_string_equal(mts_pbtxt_get(&root, "max_batch_size")->scalar, "16");
    const mts_pbtxt *in = mts_pbtxt_get(&root, "input");
    assert_non_null(in);
    assert_int_equal(in->line, 6);
    int dims = 0;
    for (int i = 0; i < in->n_kids; i++) dims += !strcmp(in->kids[i].name, "dims");
    assert_int_equal(dims, 3); /* the list became three repeated fields */
    int groups = 0;
    for (int i = 0; i < root.n_kids; i++) groups += !strcmp(root.kids[i].name, "instance_group");
    assert_int_equal(groups, 2);
    mts_pbtxt_free(&root);
    static const char *bad[][2] = {{"max_batch_size 16\n", "config.pbtxt:1: expected ':' or '{'"},
                                   {"a {\n b: 1\n", "config.pbtxt:3: a message is not closed"},
                                   {"a: [1, 2\n", "unterminated list"},
                                   {"a: [1 2]", "expected ',' or ']'"},
                                   {"a: \"x\n\"", "config.pbtxt:1: a string runs past the end of its line"},
                                   {"\n\n: 3", "config.pbtxt:3: expected a field name"},
                                   {"a:", "expected a value"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = (mts_err){0};
        assert_int_equal(mts_pbtxt_parse(bad[i][0], strlen(bad[i][0]), "config.pbtxt", &root, &err), MTS_EINVAL);
        if (!strstr(err.msg, bad[i][1])) fail_msg("'%s': message '%s' lacks '%s'", bad[i][0], err.msg, bad[i][1]);
    }
    char deep[200];
    memset(deep, 0, sizeof deep);
    for (int i = 0; i < 40; i++) strcat(deep, "a{");
    assert_int_equal(mts_pbtxt_parse(deep, strlen(deep), "config.pbtxt", &root, &err), MTS_ELIMIT);
    assert_non_null(strstr(err.msg, "nested deeper than 32"));
    size_t n = strlen(triton_pbtxt);
    for (size_t len = 0; len < n; len++) { /* each prefix: parses or fails with a message */
        char *cut = malloc(len + 1);
        memcpy(cut, triton_pbtxt, len);
        err = (mts_err){0};
        if (mts_pbtxt_parse(cut, len, "config.pbtxt", &root, &err) == MTS_OK) mts_pbtxt_free(&root);
        else assert_true(err.msg[0] != 0);
        free(cut);
    }
}

/* A Triton model repository served unchanged: <name>/config.pbtxt and <name>/<version>/model.onnx. */
static void test_triton_repository(void **state)
{
    (void)state;
    char dir[] = "/tmp/mts_triton_XXXXXX", p[600];
    assert_non_null(mkdtemp(dir));
    const char *paths[] = {"seg", "seg/1", "seg/3", "seg/10", "pinned", "pinned/1", "pinned/2"};
    for (int i = 0; i < 7; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, paths[i]);
        assert_int_equal(mkdir(p, 0700), 0);
    }
    snprintf(p, sizeof p, "%s/seg/config.pbtxt", dir);
    write_file(p, triton_pbtxt);
    const char *files[] = {"seg/1/model.onnx", "seg/3/model.onnx", "pinned/1/model.onnx", "pinned/2/model.onnx"};
    for (int i = 0; i < 4; i++) { /* seg/10 has no model file: not a version */
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        write_file(p, "onnx");
    }
    snprintf(p, sizeof p, "%s/pinned/config.pbtxt", dir);
    write_file(p, "max_batch_size: 0\nversion_policy: { specific: { versions: [1] } }\n");
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    mts_config_defaults(&c);
    assert_int_equal(mts_config_scan_repository(&c, dir, on_warn, &w, &err), MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    const mts_model_config *seg = mts_config_find_model(&c, "seg"), *pin = mts_config_find_model(&c, "pinned");
    assert_non_null(seg);
    assert_non_null(pin);
    snprintf(p, sizeof p, "%s/seg/3/model.onnx", dir);
    assert_string_equal(seg->model_path, p);
    assert_int_equal(seg->version, 3);
    assert_int_equal(seg->max_batch, 16);
    assert_int_equal(seg->max_queue_delay_us, 500);
    assert_int_equal(seg->instances, 3); /* 2 + 1 */
    assert_int_equal(pin->version, 1);   /* version_policy specific [1] */
    assert_int_equal(pin->max_batch, 1);  /* max_batch_size 0: no batch dimension */
    assert_true(pin->no_batching);
    assert_false(seg->no_batching);
    assert_int_equal(pin->max_queue_delay_us, 0);
    assert_int_equal(count_warns(&w, "field 'model_warmup' does not apply"), 1);
    assert_int_equal(count_warns(&w, "input"), 0);
    mts_config_free(&c);
    /* a broken config.pbtxt names file and line */
    snprintf(p, sizeof p, "%s/seg/config.pbtxt", dir);
    write_file(p, "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: soon }\n");
    mts_config_defaults(&c);
    assert_int_equal(mts_config_scan_repository(&c, dir, on_warn, &w, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "seg/config.pbtxt:2: max_queue_delay_microseconds must be an integer"));
    mts_config_free(&c);
    snprintf(p, sizeof p, "rm -rf '%s'", dir);
    assert_int_equal(system(p), 0);
}

static void test_warnings_once(void **state)
{
    (void)state;
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    const char *y = "server:\n"
                    "  port: 1\n"
                    "  colour: blue\n"
                    "tracing:\n"
                    "  enabled: true\n"
                    "onnx:\n"
                    "  library_path: /x.so\n"
                    "  intra_op_threads: 4\n"
                    "models:\n"
                    "  a:\n"
                    "    model_path: a.onnx\n"
                    "    colour: red\n"
                    "  b:\n"
                    "    model_path: b.onnx\n"
                    "    colour: red\n";
    assert_int_equal(parse(y, "w.yaml", &c, &w, &err), MTS_OK);
    assert_int_equal(w.n, 6);
    assert_int_equal(count_warns(&w, "w.yaml:3: unknown key 'server.colour'; ignored"), 1);
    assert_int_equal(count_warns(&w, "w.yaml:4: unknown key 'tracing'; ignored"), 1);
    assert_int_equal(count_warns(&w, "w.yaml:7: key 'onnx.library_path' does not apply to mtserve"), 1);
    assert_int_equal(count_warns(&w, "w.yaml:8: key 'onnx.intra_op_threads' does not apply"), 1);
    assert_int_equal(count_warns(&w, "w.yaml:12: unknown key 'models.a.colour'"), 1);
    assert_int_equal(count_warns(&w, "w.yaml:15: unknown key 'models.b.colour'"), 1);
    assert_int_equal(count_warns(&w, "enabled"), 0);
    assert_int_equal(count_warns(&w, "did you mean"), 0); /* 'colour', 'tracing': nothing close */
    mts_config_free(&c);
    /* Misspelt keys name the nearest known key of their section. */
    warns w2 = {0};
    const char *typo = "server:\n  http_prot: 1\ncapacty:\n  max_models: 3\nmodels:\n  a:\n    model_path: a.onnx\n"
                       "    max_bacth: 4\n    preloda: true\n";
    assert_int_equal(parse(typo, "t.yaml", &c, &w2, &err), MTS_OK);
    assert_int_equal(w2.n, 4);
    assert_int_equal(count_warns(&w2, "t.yaml:2: unknown key 'server.http_prot'; ignored (did you mean 'http_port'?)"), 1);
    assert_int_equal(count_warns(&w2, "t.yaml:3: unknown key 'capacty'; ignored (did you mean 'capacity'?)"), 1);
    assert_int_equal(count_warns(&w2, "unknown key 'models.a.max_bacth'; ignored (did you mean 'max_batch'?)"), 1);
    assert_int_equal(count_warns(&w2, "unknown key 'models.a.preloda'; ignored (did you mean 'preload'?)"), 1);
    mts_config_free(&c);
    /* A NULL callback is allowed. */
    assert_int_equal(mts_config_parse_yaml(y, strlen(y), "w.yaml", &c, NULL, NULL, &err), MTS_OK);
    mts_config_free(&c);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load_file_relative_paths(void **state)
{
    (void)state;
    char dir[] = "/tmp/mts_cfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], inner[256];
    snprintf(inner, sizeof inner, "%s/etc", dir);
    assert_int_equal(mkdir(inner, 0700), 0);
    snprintf(path, sizeof path, "%s/config.yaml", inner);
    write_file(path, "models:\n  m:\n    model_path: ../models/m.onnx\n    background_dir: bg\n"
                     "    crop_rects_path: /abs/crop.json\n");
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    assert_int_equal(mts_config_load_yaml(path, &c, on_warn, &w, &err), MTS_OK);
    char want[300];
    snprintf(want, sizeof want, "%s/../models/m.onnx", inner);
    assert_string_equal(c.models[0].model_path, want);
    snprintf(want, sizeof want, "%s/bg", inner);
    assert_string_equal(c.models[0].background_dir, want);
    assert_string_equal(c.models[0].crop_rects_path, "/abs/crop.json");
    assert_string_equal(c.source, path);
    mts_config_free(&c);
    /* An error in a file names the file and line. */
    write_file(path, "capacity:\n  max_models: lots\n");
    assert_int_equal(mts_config_load_yaml(path, &c, on_warn, &w, &err), MTS_EINVAL);
    char head[300];
    snprintf(head, sizeof head, "%s:2: key 'capacity.max_models'", path);
    assert_non_null(strstr(err.msg, head));
    unlink(path);
    rmdir(inner);
    rmdir(dir);
}

static void test_repository_scan(void **state)
{
    (void)state;
    char dir[] = "/tmp/mts_repo_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p[512];
    const char *subs[] = {"zeta", "alpha", "beta", "empty"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
        assert_int_equal(mkdir(p, 0700), 0);
        if (i < 3) {
            snprintf(p, sizeof p, "%s/%s/model.onnx", dir, subs[i]);
            write_file(p, "not really onnx");
        }
    }
    snprintf(p, sizeof p, "%s/beta/config.yaml", dir);
    write_file(p, "max_batch: 4\npreload: true\nmax_queue_delay_ms: 1\nbackground_dir: frames\ncolour: 1\n");

    mts_config c;
    warns w = {0};
    mts_err err = {0};
    /* "zeta" is configured in YAML already and must be kept as it is. */
    assert_int_equal(parse("models:\n  zeta:\n    model_path: /elsewhere/z.onnx\n", "cfg.yaml", &c, &w, &err),
                     MTS_OK);
    assert_int_equal(mts_config_scan_repository(&c, dir, on_warn, &w, &err), MTS_OK);
    assert_int_equal(c.n_models, 3);
    assert_string_equal(c.models[0].name, "zeta");
    assert_string_equal(c.models[0].model_path, "/elsewhere/z.onnx");
    assert_string_equal(c.models[1].name, "alpha");
    assert_string_equal(c.models[2].name, "beta");
    snprintf(p, sizeof p, "%s/alpha/model.onnx", dir);
    assert_string_equal(c.models[1].model_path, p);
    const mts_model_config *b = mts_config_find_model(&c, "beta");
    assert_int_equal(b->max_batch, 4);
    assert_true(b->preload);
    assert_int_equal(b->max_queue_delay_us, 1000);
    snprintf(p, sizeof p, "%s/beta/frames", dir);
    assert_string_equal(b->background_dir, p);
    /* warnings: the unknown key in beta/config.yaml (line 5), the folder without model.onnx */
    assert_int_equal(w.n, 2);
    snprintf(p, sizeof p, "%s/beta/config.yaml:5: unknown key 'colour'", dir);
    assert_int_equal(count_warns(&w, p), 1);
    assert_int_equal(count_warns(&w, "no model.onnx"), 1);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    assert_int_equal(c.models[1].max_batch, 8);
    mts_config_free(&c);

    /* A repository on its own; a bad value in a folder's config.yaml names file, line, key. */
    snprintf(p, sizeof p, "%s/beta/config.yaml", dir);
    write_file(p, "preload: true\n\nmax_batch: many\n");
    mts_config_defaults(&c);
    assert_int_equal(mts_config_scan_repository(&c, dir, NULL, NULL, &err), MTS_EINVAL);
    char want[600];
    snprintf(want, sizeof want, "%s/beta/config.yaml:3: key 'max_batch': expected a non-negative integer, got 'many'", dir);
    assert_string_equal(err.msg, want);
    mts_config_free(&c);

    mts_config_defaults(&c);
    assert_int_equal(mts_config_scan_repository(&c, "/nonexistent/repo", NULL, NULL, &err), MTS_ENOTFOUND);
    mts_config_free(&c);

    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s/model.onnx", dir, subs[i]);
        unlink(p);
        snprintf(p, sizeof p, "%s/%s/config.yaml", dir, subs[i]);
        unlink(p);
        snprintf(p, sizeof p, "%s/%s", dir, subs[i]);
        rmdir(p);
    }
    rmdir(dir);
}

/* One folder scanned at run time (poll mode): the version picked as at start, the base
 * configuration's defaults and the environment applied, errors and empty folders reported. */
static void test_scan_model(void **state)
{
    (void)state;
    char dir[] = "/tmp/mts_scanone_XXXXXX", p[600];
    assert_non_null(mkdtemp(dir));
    const char *paths[] = {"tri", "tri/1", "tri/2", "flat", "empty", "bad"};
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, paths[i]);
        assert_int_equal(mkdir(p, 0700), 0);
    }
    const char *files[] = {"tri/1/model.onnx", "tri/2/model.onnx", "flat/model.onnx", "bad/model.onnx"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        write_file(p, "onnx");
    }
    snprintf(p, sizeof p, "%s/tri/config.pbtxt", dir);
    write_file(p, "max_batch_size: 4\n");
    snprintf(p, sizeof p, "%s/flat/config.yaml", dir);
    write_file(p, "background_dir: frames\npreload: true\n");
    snprintf(p, sizeof p, "%s/bad/config.pbtxt", dir);
    write_file(p, "max_batch_size: -5\n");
    mts_config base;
    mts_config_defaults(&base);
    base.queue_size = 7;
    base.workers_per_device = 3;
    mts_err err = {0};
    assert_int_equal(mts_config_finalize(&base, &err), MTS_OK);
    memset(fake_env, 0, sizeof fake_env);
    fake_env[0][0] = "ML_ENABLE_PARALLEL_INFERENCE";
    fake_env[0][1] = "false";
    warns w = {0};
    mts_model_config *m = NULL;
    assert_int_equal(mts_config_scan_model(&base, dir, "tri", fake_getenv, &m, on_warn, &w, &err), MTS_OK);
    assert_non_null(m);
    snprintf(p, sizeof p, "%s/tri/2/model.onnx", dir);
    assert_string_equal(m->model_path, p);
    assert_int_equal(m->version, 2);
    assert_int_equal(m->max_batch, 4);
    assert_int_equal(m->queue_size, 7); /* base's server.queue_size */
    assert_int_equal(m->instances, 1);  /* ML_ENABLE_PARALLEL_INFERENCE=false */
    mts_model_config_free(m);
    memset(fake_env, 0, sizeof fake_env);
    assert_int_equal(mts_config_scan_model(&base, dir, "flat", fake_getenv, &m, on_warn, &w, &err), MTS_OK);
    assert_non_null(m);
    assert_int_equal(m->instances, 3);
    assert_true(m->preload);
    snprintf(p, sizeof p, "%s/flat/frames", dir);
    assert_string_equal(m->background_dir, p); /* relative to the folder */
    mts_model_config_free(m);
    w.n = 0;
    assert_int_equal(mts_config_scan_model(&base, dir, "empty", fake_getenv, &m, on_warn, &w, &err), MTS_OK);
    assert_null(m);
    assert_int_equal(count_warns(&w, "no model.onnx in this folder"), 1);
    assert_int_equal(mts_config_scan_model(&base, dir, "gone", fake_getenv, &m, on_warn, &w, &err), MTS_OK);
    assert_null(m);
    assert_int_equal(mts_config_scan_model(&base, dir, "bad", fake_getenv, &m, on_warn, &w, &err), MTS_EINVAL);
    assert_null(m);
    assert_non_null(strstr(err.msg, "bad/config.pbtxt:1: max_batch_size must be an integer"));
    mts_model_config_free(NULL);
    mts_config_free(&base);
    snprintf(p, sizeof p, "rm -rf '%s'", dir);
    assert_int_equal(system(p), 0);
}

/* Embedding-model keys: YAML (models: entries) and config.pbtxt parameters, with their errors. */
static void test_embedding_keys(void **state)
{
    (void)state;
    mts_config c;
    warns w = {0};
    mts_err err = {0};
    const char *y = "models:\n  emb:\n    model_path: /m/model.onnx\n    tokenizer: tok/vocab.txt\n    pooling: CLS\n"
                    "    normalize: true\n    lowercase: false\n    max_tokens: 256\n    input_ids_name: ids\n"
                    "    output_name: pooled\n  plain:\n    model_path: /m/p.onnx\n";
    assert_int_equal(mts_config_parse_yaml(y, strlen(y), "/etc/mts/c.yaml", &c, on_warn, &w, &err), MTS_OK);
    const mts_model_config *e = mts_config_find_model(&c, "emb"), *p = mts_config_find_model(&c, "plain");
    assert_string_equal(e->tokenizer_path, "/etc/mts/tok/vocab.txt"); /* relative to the config file */
    assert_int_equal(e->pooling, MTS_POOL_CLS);
    assert_true(e->normalize);
    assert_int_equal(e->lowercase, 2);
    assert_int_equal(e->max_tokens, 256);
    assert_string_equal(e->input_ids_name, "ids");
    assert_string_equal(e->output_name, "pooled");
    assert_null(e->attention_mask_name);
    assert_null(p->tokenizer_path);
    assert_int_equal(p->pooling, MTS_POOL_MEAN);
    assert_int_equal(w.n, 0);
    mts_config_free(&c);
    expect_error("models:\n  e:\n    model_path: m.onnx\n    pooling: max\n", MTS_EINVAL, "t.yaml:4",
                 "'mean', 'cls', 'last'");
    expect_error("models:\n  e:\n    model_path: m.onnx\n    max_tokens: 1\n", MTS_EINVAL, "max_tokens", NULL);
    expect_error("models:\n  e:\n    model_path: m.onnx\n    normalize: maybe\n", MTS_EINVAL, "true or false", NULL);

    char dir[] = "/tmp/mts_embcfg_XXXXXX", path[600];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/enc", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/enc/model.onnx", dir);
    write_file(path, "onnx");
    snprintf(path, sizeof path, "%s/enc/config.pbtxt", dir);
    write_file(path, "max_batch_size: 8\n"
                     "parameters { key: \"tokenizer\" value: { string_value: \"vocab.txt\" } }\n"
                     "parameters { key: \"pooling\" value: { string_value: \"last\" } }\n"
                     "parameters { key: \"normalize\" value: { string_value: \"yes\" } }\n"
                     "parameters { key: \"max_tokens\" value: { string_value: \"128\" } }\n"
                     "parameters { key: \"engine_batch\" value: { string_value: \"4\" } }\n"
                     "parameters { key: \"foo\" value: { string_value: \"1\" } }\n");
    mts_config_defaults(&c);
    w.n = 0;
    assert_int_equal(mts_config_scan_repository(&c, dir, on_warn, &w, &err), MTS_OK);
    e = mts_config_find_model(&c, "enc");
    assert_non_null(e);
    snprintf(path, sizeof path, "%s/enc/vocab.txt", dir);
    assert_string_equal(e->tokenizer_path, path); /* relative to the model folder */
    assert_int_equal(e->pooling, MTS_POOL_LAST);
    assert_true(e->normalize);
    assert_int_equal(e->max_tokens, 128);
    assert_int_equal(e->engine_batch, 4);
    assert_int_equal(count_warns(&w, "parameter 'foo' does not apply"), 1);
    mts_config_free(&c);
    snprintf(path, sizeof path, "%s/enc/config.pbtxt", dir);
    write_file(path, "parameters { key: \"engine_batch\" value: { string_value: \"8x\" } }\n");
    mts_config_defaults(&c);
    err = (mts_err){0};
    assert_int_equal(mts_config_scan_repository(&c, dir, on_warn, &w, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "config.pbtxt:1: parameter 'engine_batch': expected an integer"));
    mts_config_free(&c);
    snprintf(path, sizeof path, "%s/enc/config.pbtxt", dir);
    write_file(path, "parameters { key: \"max_tokens\" value: { string_value: \"lots\" } }\n");
    mts_config_defaults(&c);
    err = (mts_err){0};
    assert_int_equal(mts_config_scan_repository(&c, dir, on_warn, &w, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "config.pbtxt:1: parameter 'max_tokens' must be an integer"));
    mts_config_free(&c);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    assert_int_equal(system(path), 0);
}

/* embedding_policy: both YAML forms, the lookup, the formatter and hostile compact text */
static void test_embedding_policy(void **state)
{
    (void)state;
    mts_config c;
    mts_err err = {0};
    const char *y = "models:\n  e:\n    model_path: /m/model.onnx\n    tokenizer: v.txt\n    embedding_policy:\n"
                    "      - {max_batch: 4, num_threads: 2}\n"
                    "      - {max_batch: 32, workers: 4, disable_matmul_parallel: true}\n"
                    "  f:\n    model_path: /m/model.onnx\n    tokenizer: v.txt\n"
                    "    embedding_policy: \"1:1x2, 8:2x1,64:8\"\n";
    assert_int_equal(mts_config_parse_yaml(y, strlen(y), "t.yaml", &c, NULL, NULL, &err), MTS_OK);
    assert_int_equal(mts_config_finalize(&c, &err), MTS_OK);
    const mts_model_config *e = mts_config_find_model(&c, "e"), *f = mts_config_find_model(&c, "f");
    char buf[256];
    mts_embed_policy_format(e, buf, sizeof buf);
    assert_string_equal(buf, "4:1x2,32:4x1");
    mts_embed_policy_format(f, buf, sizeof buf);
    assert_string_equal(buf, "1:1x2,8:2x1,64:8x0");
    assert_int_equal(mts_embed_policy_for(e, 1)->threads, 2);
    assert_int_equal(mts_embed_policy_for(e, 4)->workers, 1);
    assert_int_equal(mts_embed_policy_for(e, 5)->workers, 4);
    assert_int_equal(mts_embed_policy_for(e, 1000)->max_batch, 32); /* the last entry beyond */
    assert_null(mts_embed_policy_for(mts_config_find_model(&c, "nope"), 3));
    mts_config_free(&c);

    mts_embed_policy p[MTS_EMBED_POLICY_MAX];
    int n = -1;
    char msg[300];
    static const struct { const char *text, *want; } bad[] = {
        {"", "empty"},
        {"8", "entry 1 ('8'): expected ':' after max_batch"},
        {"8:", "expected workers"},
        {"8:2x", "expected threads"},
        {"8:2y1", "',' or the end"},
        {"0:1x1", "expected max_batch"},
        {"4097:1x1", "expected max_batch"},
        {"99999999999999999999:1x1", "expected max_batch"},
        {"8:257x1", "expected workers"},
        {"8:1x1025", "expected threads"},
        {"8:1x-1", "expected threads"},
        {"8:1x1,", "a ',' ends the policy"},
        {"8:1x1,4:1x1", "entry 2: max_batch 4 is not above the previous entry's 8"},
        {"2:4x1", "entry 1: workers 4 is more than max_batch 2"},
        {"1:1,2:1,3:1,4:1,5:1,6:1,7:1,8:1,9:1,10:1,11:1,12:1,13:1,14:1,15:1,16:1,17:1", "more than 16 entries"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msg[0] = 0;
        assert_int_equal(mts_embed_policy_parse(bad[i].text, p, &n, msg, sizeof msg), -1);
        if (!strstr(msg, bad[i].want)) fail_msg("'%s': got '%s', want '%s'", bad[i].text, msg, bad[i].want);
    }
    char *big = malloc(5000);
    assert_non_null(big);
    memset(big, '1', 4999);
    big[4999] = 0;
    assert_int_equal(mts_embed_policy_parse(big, p, &n, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "at most 1024"));
    free(big);
    assert_int_equal(n, -1); /* untouched on error */

    expect_error("models:\n  e:\n    model_path: m.onnx\n    tokenizer: v.txt\n    embedding_policy:\n"
                 "      - {max_batch: 4}\n      - {max_batch: 8, workers: 2, threads: 3, threads: 1}\n",
                 MTS_EINVAL, "t.yaml:7", "given twice");
    expect_error("models:\n  e:\n    model_path: m.onnx\n    tokenizer: v.txt\n    embedding_policy:\n"
                 "      - {max_batch: 4}\n      - [8, 2]\n", MTS_EINVAL, "embedding_policy[2]'", "a mapping");
    expect_error("models:\n  e:\n    model_path: m.onnx\n    tokenizer: v.txt\n    embedding_policy:\n"
                 "      - {max_batch: 4, threads: 1, num_threads: 2}\n", MTS_EINVAL, "embedding_policy[1].num_threads",
                 "give only one");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed000),
        cmocka_unit_test(test_seed001),
        cmocka_unit_test(test_seed002),
        cmocka_unit_test(test_seed_snippets),
        cmocka_unit_test(test_values_and_forms),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_finalize_errors),
        cmocka_unit_test(test_ml_service_env),
        cmocka_unit_test(test_warnings_once),
        cmocka_unit_test(test_load_file_relative_paths),
        cmocka_unit_test(test_repository_scan),
        cmocka_unit_test(test_triton_pbtxt),
        cmocka_unit_test(test_triton_repository),
        cmocka_unit_test(test_scan_model),
        cmocka_unit_test(test_embedding_keys),
        cmocka_unit_test(test_embedding_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
