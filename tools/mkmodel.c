/* tools/mkmodel.c - placeholder until the model maker lands. */
int main(void) { return 0; }
