/* SPDX-License-Identifier: Apache-2.0 */
/* The version of the loaded library, for callers that compare it with their headers. */
#include "kvtier/version.h"

const char *kvt_version(void)
{
    return KVT_VERSION_STRING;
}
