/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Intrusive doubly linked circular list (the Linux list.h idea): a node lives inside the object
 * it links, so linking and unlinking never allocate. A detached node points to itself, which
 * makes "is this node on a list?" a constant-time question.
 */
#ifndef KVT_BASE_LIST_H
#define KVT_BASE_LIST_H

#include <stdbool.h>
#include <stddef.h>

#include "base/util.h"

typedef struct kvt_list {
    struct kvt_list *prev, *next;
} kvt_list;

static inline void kvt_list_init(kvt_list *n)
{
    n->prev = n->next = n;
}

static inline bool kvt_list_empty(const kvt_list *head)
{
    return head->next == head;
}

/* True if n (initialised with kvt_list_init) is currently on some list. */
static inline bool kvt_list_linked(const kvt_list *n)
{
    return n->next != n;
}

static inline void kvt_list_insert_between(kvt_list *n, kvt_list *prev, kvt_list *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}

static inline void kvt_list_push_back(kvt_list *head, kvt_list *n)
{
    kvt_list_insert_between(n, head->prev, head);
}

static inline void kvt_list_push_front(kvt_list *head, kvt_list *n)
{
    kvt_list_insert_between(n, head, head->next);
}

static inline void kvt_list_remove(kvt_list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* First node or NULL when empty. */
static inline kvt_list *kvt_list_first(const kvt_list *head)
{
    return head->next == head ? NULL : head->next;
}

/* Node after n or NULL at the end. */
static inline kvt_list *kvt_list_next(const kvt_list *head, const kvt_list *n)
{
    return n->next == head ? NULL : n->next;
}

#define kvt_list_entry(ptr, type, member) kvt_container_of(ptr, type, member)

#define kvt_list_for_each(pos, head) for (pos = (head)->next; pos != (head); pos = pos->next)

#endif
