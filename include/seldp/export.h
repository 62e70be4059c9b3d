/** @file
 * SELDP_API: marks the declarations of the public API.
 *
 * libseldp is built with hidden symbol visibility, so that only what a public header
 * declares with SELDP_API is exported from the shared library; internal seldp__ helpers
 * stay inside it. Every public function declaration carries the macro. */
#ifndef SELDP_EXPORT_H
#define SELDP_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define SELDP_API __attribute__((visibility("default")))
#else
#define SELDP_API
#endif

#endif
