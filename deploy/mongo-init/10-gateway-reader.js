// The MCP gateway reads the store and writes nothing (docs/security.md, "The MCP gateway"): a
// MongoDB user with the `read` role on the vancetope database only. MongoDB runs the scripts of
// /docker-entrypoint-initdb.d once, when it starts on an empty data volume (compose.yaml).
db.getSiblingDB("admin").createUser({
  user: process.env.MONGO_GATEWAY_USER,
  pwd: process.env.MONGO_GATEWAY_PASSWORD,
  roles: [{ role: "read", db: "vancetope" }],
});
