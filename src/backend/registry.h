/* Every compute unit q3 was built with, in order of preference. */
#ifndef Q3_BACKEND_REGISTRY_H
#define Q3_BACKEND_REGISTRY_H

#include "backend/backend.h"

/* NULL-terminated, most preferred first; the reference unit is last. */
extern const q3_backend *const q3_backends[];

/* Finds a unit by name (NULL if q3 has none by that name). */
const q3_backend *q3_backend_find(const char *name);
/* The most preferred unit that is present (never NULL: ref is always there). */
const q3_backend *q3_backend_default(void);

#endif
