/* One option's line of --help, as lmhost's commands print it (core/cli's cli_help): for the
 * text subcommands (tokenize, detokenize, template), whose libraries stand on their own. */
#ifndef LMHOST_TEXT_CLI_HELP_H
#define LMHOST_TEXT_CLI_HELP_H

#include <stdio.h>
#include <string.h>

/* "  --name ARG   help [default: DEF]" (or "[required...]"), words wrapped at 80 columns. */
static inline void text_cli_help_row(FILE *f, const char *name, const char *arg, const char *def,
                                     const char *help) {
    enum { COL = 29, WIDTH = 80 };
    char lab[128], text[1024];
    snprintf(lab, sizeof lab, "%s%s%s", name, arg ? " " : "", arg ? arg : "");
    if ((int)strlen(lab) > COL - 3)
        fprintf(f, "  %s\n%*s", lab, COL, "");
    else
        fprintf(f, "  %-*s", COL - 2, lab);
    int req = def && !strncmp(def, "required", 8);
    snprintf(text, sizeof text, "%s%s%s%s", help ? help : "",
             def ? (req ? " [" : " [default: ") : "", def ? def : "", def ? "]" : "");
    int pos = COL;
    for (const char *t = text; *t;) {
        while (*t == ' ') t++;
        int len = (int)strcspn(t, " ");
        if (!len) break;
        const char *close = *t == '[' ? strchr(t, ']') : NULL;
        if (close && close - t + 1 <= WIDTH - COL) len = (int)(close - t + 1);
        if (pos > COL && pos + 1 + len > WIDTH) {
            fprintf(f, "\n%*s", COL, "");
            pos = COL;
        }
        fprintf(f, "%s%.*s", pos > COL ? " " : "", len, t);
        pos += (pos > COL) + len;
        t += len;
    }
    fputc('\n', f);
}

#endif
