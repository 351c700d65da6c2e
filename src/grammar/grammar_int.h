/* grammar_int.h - the compiled form of a grammar, shared by the GBNF
 * parser (gbnf.c) and the matcher (match.c).
 *
 * Every alternative of every rule is a run of elements in one array, ended
 * by an END element: a character set (ranges of code points, maybe
 * negated) or a reference to a rule.  A parse stack is a list of element
 * positions, the top being the next element to match. */
#ifndef MX_GRAMMAR_INT_H
#define MX_GRAMMAR_INT_H

#include <stdint.h>

#include "grammar/grammar.h"

enum { GE_END, GE_CHARS, GE_RULE };

typedef struct g_elem {
    uint8_t type;
    uint8_t neg;                 /* GE_CHARS: the set is the complement */
    uint32_t a, n;               /* GE_CHARS: ranges[a .. a+n) pairs; GE_RULE: rule a */
} g_elem;

struct mx_grammar {
    g_elem *el;
    uint32_t n_el;
    uint32_t *ranges;            /* lo, hi pairs (inclusive) */
    uint32_t n_ranges;
    uint32_t *alts;              /* start element of each alternative */
    uint32_t *rule_alt;          /* rule r: alts[rule_alt[r] .. rule_alt[r + 1]) */
    uint32_t n_rules;
    uint32_t root;
};

#endif
