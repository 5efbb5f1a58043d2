"""The web UI (`python -m simpletuner serve`): a thin layer over ordinary runs. A run made here
is a folder with its config.json and multidatabackend.json, launched through ./train.sh as its
own process group; the server keeps only a queue (SQLite) and reads each run from its files, so
a restarted server finds every run as it is. docs/API.md documents the JSON API."""
