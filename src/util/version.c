/* The library's version, for programs that check they run with the header they were built against. */
#include "q3.h"

const char *q3_version(void) { return Q3_VERSION_STRING; }
