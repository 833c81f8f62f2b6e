#!/bin/sh
# The type check and the lint side by side: each builds a TypeScript program of the whole
# project (the lint's promise rules are type-aware), each using a little more than one core,
# so on a two-core host both end in about the time of the longer one. Fails if either does.
tsc --noEmit -p . & typecheck=$!
eslint . & lint=$!
wait "$typecheck"; typecheck_status=$?
wait "$lint"; lint_status=$?
[ "$typecheck_status" -eq 0 ] && [ "$lint_status" -eq 0 ]
