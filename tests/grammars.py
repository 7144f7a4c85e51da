"""Grammars shared by the grammar-backend and DSL tests (EBNF for the backends, the same language in Lark to
check outputs)."""

# Arithmetic over small numbers, bounded depth and length (a greedy run must finish).
ARITH_EBNF = r'''root ::= expr
expr ::= term | term op term | term op term op term
term ::= num | "(" num op num ")"
op ::= " + " | " - " | " * "
num ::= [1-9] | [1-9] [0-9]
'''
ARITH_LARK = r'''start: expr
expr: term | term OP term | term OP term OP term
term: NUM | "(" NUM OP NUM ")"
OP: " + " | " - " | " * "
NUM: /[1-9][0-9]?/
'''
