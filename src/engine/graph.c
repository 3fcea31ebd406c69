/*
 * Attribute lookup on graph nodes. Nodes carry few attributes, so a linear scan by name is
 * cheaper than any index; kernels call these at plan time and run time alike.
 */
#include <string.h>

#include "engine/graph.h"

const mts_attr *mts_node_attr(const mts_node *n, const char *name)
{
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
    return NULL;
}

int64_t mts_attr_int(const mts_node *n, const char *name, int64_t dflt)
{
    const mts_attr *a = mts_node_attr(n, name);
    return (a && a->type == MTS_ATTR_INT) ? a->i : dflt;
}

float mts_attr_float(const mts_node *n, const char *name, float dflt)
{
    const mts_attr *a = mts_node_attr(n, name);
    if (!a) return dflt;
    if (a->type == MTS_ATTR_FLOAT) return a->f;
    if (a->type == MTS_ATTR_INT) return (float)a->i;
    return dflt;
}

const char *mts_attr_string(const mts_node *n, const char *name, const char *dflt)
{
    const mts_attr *a = mts_node_attr(n, name);
    return (a && a->type == MTS_ATTR_STRING) ? a->s : dflt;
}

const int64_t *mts_attr_ints(const mts_node *n, const char *name, int *n_out)
{
    const mts_attr *a = mts_node_attr(n, name);
    if (!a || a->type != MTS_ATTR_INTS) {
        *n_out = 0;
        return NULL;
    }
    *n_out = a->n;
    return a->ints;
}

const float *mts_attr_floats(const mts_node *n, const char *name, int *n_out)
{
    const mts_attr *a = mts_node_attr(n, name);
    if (!a || a->type != MTS_ATTR_FLOATS) {
        *n_out = 0;
        return NULL;
    }
    *n_out = a->n;
    return a->floats;
}

const char *const *mts_attr_strings(const mts_node *n, const char *name, int *n_out)
{
    const mts_attr *a = mts_node_attr(n, name);
    if (!a || a->type != MTS_ATTR_STRINGS || !a->strings) {
        *n_out = 0;
        return NULL;
    }
    *n_out = a->n;
    return a->strings;
}
