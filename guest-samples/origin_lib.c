/* The library origin_prog.c finds beside its own file ($ORIGIN/lib). */
int origin_answer(void) { return 42; }
