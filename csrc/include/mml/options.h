/*
 * mml/options.h — the one table of the loader's options.
 *
 * Every option of mmloader.Loader that reaches the engine is one row of
 * mml_loader_options (options.c): its name (the Loader keyword and the key of the
 * configuration dict), type, field of mml_loader_cfg, default, bounds, enum names and
 * whether it enters the resume fingerprint.  The Python binding parses the configuration
 * by this table (unknown keys and bad values are errors naming the option), exports it
 * (mmloader._core.loader_options()), and mmloader.Loader takes its defaults, checks and
 * fingerprint from it; its docstring's option section and the command lines' flags
 * (mmloader/_cli.py) are generated from the rows.  Adding an option: a field in mml_loader_cfg (or a struct inside
 * it), one row in options.c, and the code that uses the field.
 *
 * Pure data and pure functions; no threads, no allocation.
 */
#ifndef MML_OPTIONS_H
#define MML_OPTIONS_H

#include "mml/loader.h"

typedef enum {
  MML_OPT_BOOL = 0, /* int field, 0 or 1 */
  MML_OPT_INT,      /* int, int32_t, int64_t or uint64_t field (see `size`) */
  MML_OPT_FLOAT,    /* double field */
  MML_OPT_STR,      /* const char * field (borrowed for the duration of mml_loader_new) */
  MML_OPT_ENUM,     /* int-sized enum field: the index of the name in `choices` */
} mml_opt_type;

enum {
  MML_OPT_FINGERPRINT = 1, /* part of the resume fingerprint (Loader.state_dict) */
  MML_OPT_NONE = 2,        /* None (Python) selects the default: "off" or "automatic" */
  MML_OPT_INTERNAL = 4,    /* set by mmloader itself, not a Loader keyword */
  MML_OPT_SECRET = 8,      /* never shown (credentials) */
  MML_OPT_PYTHON = 16,     /* a Loader keyword resolved in Python (preset, tokenizer, vision
                              overrides): no field of mml_loader_cfg, never set or read here;
                              its row gives its type, default, choices and doc */
};

typedef struct mml_option {
  const char *name;
  mml_opt_type type;
  size_t offset;              /* of the field in mml_loader_cfg */
  int size;                   /* sizeof the field */
  double def;                 /* default: number, 0/1, or the enum index (STR: NULL) */
  double lo, hi;              /* inclusive bounds of INT and FLOAT values */
  const char *const *choices; /* ENUM: the names, NULL-terminated; index = value */
  int flags;                  /* MML_OPT_* */
  const char *doc;            /* the Loader docstring's entry; its first sentence is the
                                 command lines' --help */
} mml_option;

/* The table (n rows). */
const mml_option *mml_loader_options(int *n);
/* The row called `name`, or NULL. */
const mml_option *mml_loader_option(const char *name);

/* Every option at its default (the rest of *c zeroed). */
void mml_loader_cfg_defaults(mml_loader_cfg *c);

/* A configuration built in C with some fields left zero: every public row whose field is
 * zero where zero is out of its bounds (and not its "None") takes the row's default. */
void mml_loader_cfg_fill_zeros(mml_loader_cfg *c);

/* What no single row can say: options that depend on each other (dp_rank < dp_size,
 * packing needs a length, ...), and the bounds of every row.  MML_ECONFIG naming them. */
mml_status mml_loader_cfg_check(const mml_loader_cfg *c, mml_err *err);

/* Setting one option of *c, checked against its row (type, bounds, enum names); a bad
 * value is MML_ECONFIG with a message naming the option, the value and what is allowed.
 * BOOL and ENUM take set_int as well (0/1, an index).  MML_OPT_PYTHON rows are refused. */
mml_status mml_option_set_int(mml_loader_cfg *c, const mml_option *o, int64_t v, mml_err *err);
mml_status mml_option_set_float(mml_loader_cfg *c, const mml_option *o, double v, mml_err *err);
mml_status mml_option_set_str(mml_loader_cfg *c, const mml_option *o, const char *v, mml_err *err);
mml_status mml_option_set_enum(mml_loader_cfg *c, const mml_option *o, const char *name,
                               mml_err *err);

/* Reading one option of *c: INT, BOOL and ENUM as an integer, FLOAT, STR; the name of an
 * ENUM value (NULL when out of range). */
int64_t mml_option_get_int(const mml_loader_cfg *c, const mml_option *o);
double mml_option_get_float(const mml_loader_cfg *c, const mml_option *o);
const char *mml_option_get_str(const mml_loader_cfg *c, const mml_option *o);
const char *mml_option_enum_name(const mml_option *o, int64_t v);
/* The names of an ENUM row as "'a', 'b', 'c'" into buf (n bytes, truncated to fit). */
void mml_option_choice_list(const mml_option *o, char *buf, size_t n);

#endif
