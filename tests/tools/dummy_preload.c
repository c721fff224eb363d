/* A library that does nothing, preloaded by the `zrtier run` tests in place of libzrtier.so so
   that they test the launcher (environment, exit status, signals) independently of the shim. */
int zrtier_tools_dummy_preload(void) { return 0; }
