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

typedef struct kvi_list {
    struct kvi_list *prev, *next;
} kvi_list;

static inline void kvi_list_init(kvi_list *n)
{
    n->prev = n->next = n;
}

static inline bool kvi_list_empty(const kvi_list *head)
{
    return head->next == head;
}

/* True if n (initialised with kvi_list_init) is currently on some list. */
static inline bool kvi_list_linked(const kvi_list *n)
{
    return n->next != n;
}

static inline void kvi_list_insert_between(kvi_list *n, kvi_list *prev, kvi_list *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}

static inline void kvi_list_push_back(kvi_list *head, kvi_list *n)
{
    kvi_list_insert_between(n, head->prev, head);
}

static inline void kvi_list_push_front(kvi_list *head, kvi_list *n)
{
    kvi_list_insert_between(n, head, head->next);
}

static inline void kvi_list_remove(kvi_list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* First node or NULL when empty. */
static inline kvi_list *kvi_list_first(const kvi_list *head)
{
    return head->next == head ? NULL : head->next;
}

/* Node after n or NULL at the end. */
static inline kvi_list *kvi_list_next(const kvi_list *head, const kvi_list *n)
{
    return n->next == head ? NULL : n->next;
}

#define kvi_list_entry(ptr, type, member) kvi_container_of(ptr, type, member)

#define kvi_list_for_each(pos, head) for (pos = (head)->next; pos != (head); pos = pos->next)

#endif
