/*
 * AddressSanitizer defaults of the ASan+UBSan build, linked into every program of that build
 * (CMakeLists.txt adds this file to each executable there; it is not part of mtscore, because a
 * definition in a static library is never pulled in: libasan's own weak one satisfies the link).
 *
 * LeakSanitizer reads the dynamic TLS blocks that its __tls_get_addr interceptor recorded; with
 * glibc 2.36 it records a bogus block on the OpenMP runtime's worker threads (libgomp, loaded
 * with oneDNN) and its exit-time tracer then crashes on it ("Tracer caught signal 11").
 * Not intercepting __tls_get_addr drops those blocks as roots; static TLS, stacks and globals
 * are still scanned. An ASAN_OPTIONS in the environment still overrides this.
 */
#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "intercept_tls_get_addr=0";
}
#else
typedef int mts_asan_options_unused; /* ISO C: a translation unit is not empty */
#endif
