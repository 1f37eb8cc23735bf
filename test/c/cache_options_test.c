/* Cache options from C11: the defaults, conf strings and single options in REFPOOL_CONF's
 * spelling (refpool_cache_options_parse, _set), errors that name the option and leave the struct
 * as it was, and the table bindings lay the struct out from (refpool_cache_option_info).
 * Prints each failed check and exits 1 if any failed. */
#include <refpool/refpool.h>

#include "c_checks.h"

#include <stddef.h>
#include <string.h>

static int same_options(const refpool_cache_options* a, const refpool_cache_options* b) {
  return a->rounding.mode == b->rounding.mode && a->rounding.parameter == b->rounding.parameter &&
         a->max_idle_bytes == b->max_idle_bytes && a->segments == b->segments;
}

static void test_defaults(void) {
  refpool_cache_options options;
  memset(&options, 0xAB, sizeof options);
  OK(refpool_cache_options_init(&options, sizeof options));
  CHECK(options.rounding.mode == REFPOOL_ROUNDING_EXACT);
  CHECK(options.max_idle_bytes == REFPOOL_UNLIMITED);
  CHECK(options.segments == REFPOOL_SEGMENTS_AUTO);
  EXPECT(refpool_cache_options_init(NULL, 0), REFPOOL_ERROR_INVALID_ARGUMENT);
}

static void test_conf_strings(void) {
  refpool_cache_options options;
  OK(refpool_cache_options_init(&options, sizeof options));
  OK(refpool_cache_options_parse(&options, sizeof options, "rounding:pow2:4,max_idle_bytes:512M"));
  CHECK(options.rounding.mode == REFPOOL_ROUNDING_POW2 && options.rounding.parameter == 4);
  CHECK(options.max_idle_bytes == (size_t)512 << 20);
  CHECK(options.segments == REFPOOL_SEGMENTS_AUTO); /* not named: kept */
  OK(refpool_cache_options_set(&options, sizeof options, "segments", "off"));
  CHECK(options.segments == REFPOOL_SEGMENTS_OFF);
  OK(refpool_cache_options_set(&options, sizeof options, "rounding", "step:512"));
  CHECK(options.rounding.mode == REFPOOL_ROUNDING_STEP && options.rounding.parameter == 512);
  OK(refpool_cache_options_set(&options, sizeof options, "max_idle_bytes", "unlimited"));
  CHECK(options.max_idle_bytes == REFPOOL_UNLIMITED);
  /* Switches: on/off, true/false, yes/no, 1/0 in any case; anything else names on, off. */
  OK(refpool_cache_options_set(&options, sizeof options, "auto_plans", "False"));
  CHECK(options.auto_plans == REFPOOL_OFF);
  OK(refpool_cache_options_parse(&options, sizeof options, "auto_plans:YES,segments:1"));
  CHECK(options.auto_plans == REFPOOL_ON && options.segments == REFPOOL_SEGMENTS_ON);
  OK(refpool_cache_options_set(&options, sizeof options, "segments", "no"));
  CHECK(options.segments == REFPOOL_SEGMENTS_OFF);
  EXPECT(refpool_cache_options_set(&options, sizeof options, "auto_plans", "maybe"), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("'auto_plans' has value 'maybe'") && error_mentions("allowed: on, off"));
  CHECK(options.auto_plans == REFPOOL_ON);

  /* A cache made from them rounds 100 bytes up to 512. */
  refpool_backend be = {0};
  refpool_cache cache = {0};
  refpool_scope scope = {0};
  refpool_buffer buffer = {0};
  const size_t dims[] = {100};
  OK(refpool_backend_new_host(&be));
  OK(refpool_cache_create(&options, sizeof options, &cache));
  OK(refpool_scope_enter(cache, &scope));
  OK(refpool_alloc(be, dims, 1, 1, NULL, 0, &buffer));
  OK(refpool_release(buffer));
  OK(refpool_scope_exit(scope));
  CHECK(stat(cache, "idle_bytes") == 512);
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_release(be));
}

static void test_errors(void) {
  refpool_cache_options options;
  refpool_cache_options before;
  OK(refpool_cache_options_init(&options, sizeof options));
  OK(refpool_cache_options_parse(&options, sizeof options, "rounding:step:64"));
  before = options;
  EXPECT(refpool_cache_options_parse(&options, sizeof options, "segments:on,rounding:pow2:3"), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("'rounding'") && error_mentions("'pow2:3'") && error_mentions("pow2:<divisions"));
  CHECK(same_options(&options, &before)); /* segments:on came first and was not kept */
  EXPECT(refpool_cache_options_set(&options, sizeof options, "segments", "sometimes"), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("off, on, auto"));
  EXPECT(refpool_cache_options_set(&options, sizeof options, "colour", "blue"), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("'colour'") && error_mentions("rounding, max_idle_bytes, segments"));
  EXPECT(refpool_cache_options_parse(&options, sizeof options, "log:/tmp/x.csv"), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("process-wide"));
  CHECK(same_options(&options, &before));
  EXPECT(refpool_cache_options_parse(&options, sizeof options, NULL), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_options_parse(NULL, 0, "segments:on"), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_options_set(&options, sizeof options, NULL, "on"), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_options_set(&options, sizeof options, "segments", NULL), REFPOOL_ERROR_INVALID_ARGUMENT);
  /* A struct with a bad field is refused before the conf is applied. */
  options.segments = (refpool_segment_policy)9;
  EXPECT(refpool_cache_options_parse(&options, sizeof options, "rounding:exact"), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("refpool_cache_options.segments is 9"));
  CHECK(options.rounding.mode == REFPOOL_ROUNDING_STEP);
}

/* The table describes the struct exactly (each field's name, place and size, taken here from the
 * same X-macro), and each default is text the library reads back to the default. */
#define LAYOUT_ROW(kind, name, default_text, description) \
  {#name, offsetof(refpool_cache_options, name), sizeof(((refpool_cache_options*)0)->name)},
static const struct {
  const char* name;
  size_t offset;
  size_t size;
} layout[] = {REFPOOL_CACHE_OPTIONS(LAYOUT_ROW)};
#undef LAYOUT_ROW

static void test_info_table(void) {
  const size_t count = refpool_cache_option_count();
  CHECK(count == sizeof layout / sizeof layout[0]);
  refpool_option_info past_end = {0};
  EXPECT(refpool_cache_option_info(count, &past_end, sizeof past_end), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(past_end.name == NULL);
  refpool_cache_options defaults;
  OK(refpool_cache_options_init(&defaults, sizeof defaults));
  for (size_t i = 0; i < count && i < sizeof layout / sizeof layout[0]; ++i) {
    refpool_option_info info = {0};
    OK(refpool_cache_option_info(i, &info, sizeof info));
    if (info.name == NULL) continue;
    CHECK(strcmp(info.name, layout[i].name) == 0);
    CHECK(info.offset == layout[i].offset && info.size == layout[i].size);
    CHECK(strlen(info.kind) > 0 && strlen(info.allowed) > 0 && strlen(info.description) > 0);
    refpool_cache_options from_default = defaults;
    OK(refpool_cache_options_set(&from_default, sizeof from_default, info.name, info.default_text));
    CHECK(same_options(&from_default, &defaults));
  }
}

int main(void) {
  test_defaults();
  test_conf_strings();
  test_errors();
  test_info_table();
  return finish("cache_options_test");
}
