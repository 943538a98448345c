/**
 * Usage text of the `mesh-agent` client commands and their exit codes, shown by
 * `mesh-agent help` (main.ts) and after a usage error (client-commands.ts). Full reference:
 * docs/cli.md. Text only, no imports: main.ts loads it on every start.
 */
/** The first words main.ts hands to client-commands.ts. */
export const CLIENT_COMMAND_NAMES: ReadonlySet<string> = new Set([
  'login',
  'bootstrap',
  'peers',
  'services',
  'routes',
  'credentials',
  'cluster',
  'webhooks',
  'events',
  'status',
  'explain',
  'ui',
]);

export const CLIENT_USAGE = `client commands (talk to an agent's management API):
  mesh-agent login --url URL --client-id ID (--client-secret SECRET | --client-secret-file FILE)
                   [--profile NAME]
  mesh-agent bootstrap --license FILE [--name N] [--description D] [--url URL] [--login]
  mesh-agent peers ls [--local|--remote] | get ID | add HOST:PORT | rename ID NAME | rm ID | leave --yes
  mesh-agent services ls [--source PEER] [--target PEER] [--interface|--no-interface] | get ID | rm ID
  mesh-agent services create --target PEER [--source PEER] [--transport tcp|kcp] [--interface]
                   [--ipv4 CIDR] [--ipv6 CIDR] [--transparent] [--bandwidth MBPS]
                   [--health-check tcp:ADDRESS:PORT|icmp:ADDRESS|none]
                   [--health-check-interval-ms MS] [--health-check-failures N]
  mesh-agent services update ID [--interface|--no-interface] [--ipv4 CIDR|none] [--ipv6 CIDR|none]
                   [--bandwidth MBPS] [--health-check tcp:ADDRESS:PORT|icmp:ADDRESS|none]
                   [--health-check-interval-ms MS] [--health-check-failures N]
  mesh-agent routes ls SERVICE | rm SERVICE ROUTE
  mesh-agent routes add SERVICE [--dest CIDR] [--source CIDR] [--priority N]
                   [--route dest=CIDR,source=CIDR,priority=N]... [--file ROUTES.json]
  mesh-agent routes update SERVICE ROUTE [--dest CIDR] [--source CIDR] [--priority N]
  mesh-agent credentials ls | create [--scope NAME]... | revoke CLIENT_ID
  mesh-agent cluster identity | init [--force] | sync | credentials | rotate [--show-secret] | license
  mesh-agent webhooks ls | add URL [--type PREFIX]... | rm ID | test ID
  mesh-agent events [--since SEQ] [--type PREFIX] [--resource ID] [--follow]   (--json: JSON lines)
  mesh-agent status
  mesh-agent explain SOURCE DESTINATION [--protocol tcp|udp|icmp] [--port N] [--peer PEER]
                   [--with JSON|FILE]
  mesh-agent ui   (prints a link that signs the web console in once, within 60 s, as this login)
Every client command takes --json (the API's JSON), --profile NAME and --url URL.
Credentials: the profile ($XDG_CONFIG_HOME/mesh-agent/NAME.json, default profile "default"), each field
overridden by MESH_URL, MESH_CLIENT_ID, MESH_CLIENT_SECRET unless --profile is given; MESH_PROFILE
picks the profile; MESH_TIMEOUT_MS bounds each request (default 15000).
Exit codes: 0 ok, 1 the API refused the request (4xx; its code and text on stderr), 2 usage error,
3 the agent cannot be reached or failed (5xx), 4 not logged in or credential refused.`;
