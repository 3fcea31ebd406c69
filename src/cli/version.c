/*
 * The version string `mtserve --version` prints: the CMake project version plus `git describe`
 * when the build was configured in a git checkout (MTS_VERSION is defined for this file only).
 */
#include "cli/cli.h"

#ifndef MTS_VERSION
#define MTS_VERSION "unknown"
#endif

const char *mts_version_string(void)
{
    return MTS_VERSION;
}
