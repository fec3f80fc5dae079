"""The load client's processes: what drives the server under test during `hotpath loadtest`.

- `sdk_shaped`: the default client process (`--client http`), speaking the Tinker SDK 0.38's
  HTTP protocol itself, with its retries (`calls`) and its session poller (`session_poll`);
- `real_sdk`: the unmodified Tinker SDK driven as a user would (`--client sdk`);
- `config`: what each client process is given and reports (`ClientConfig`, `prompt_for`,
  the result check), shared by both and by `impl.harness.drive`, which spawns them.
"""
