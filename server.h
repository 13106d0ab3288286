// server.h: `djinn serve MODEL.bin ...`: an OpenAI-compatible HTTP server over one engine (server.c).
#ifndef DJINN_SERVER_H
#define DJINN_SERVER_H

// argv[0] is "serve"; returns the process's exit code (0 after SIGINT or SIGTERM, 1 on an error, 2 on bad usage).
int serve_main(int argc, char **argv);

#endif
