/**
 * The kernel's answers without a process per question: one netlink request and its replies, and
 * one nft command run through libnftables in this process. The only module that loads the netlink
 * addon (build/Release/mesh_netlink.node, from native/netlink.cc); the bytes are built and read by
 * src/dataplane/kernel/rtnetlink.ts. Used by src/dataplane/kernel/linux.ts; Node built-ins only.
 */
import { loadAddon } from './load-addon.js';

interface NetlinkAddon {
  request(protocol: number, message: Buffer, netnsPath?: string): Buffer;
  nftList(command: string, netnsPath?: string): { code: number; output: string; error: string };
}

let addon: NetlinkAddon | undefined;
const load = (): NetlinkAddon => {
  addon ??= loadAddon<NetlinkAddon>('mesh_netlink.node');
  return addon;
};

export const NETLINK_ROUTE = 0;

/** The path `ip netns` keeps a named namespace at. */
const netnsPath = (netns: string | undefined) => (netns === undefined ? undefined : `/run/netns/${netns}`);

/**
 * Sends one netlink message (in the named namespace, `ip netns add NAME`) and returns the replies:
 * all of a dump, up to its end; the one answer otherwise.
 */
export function netlinkRequest(protocol: number, message: Buffer, netns?: string): Buffer {
  return load().request(protocol, message, netnsPath(netns));
}

/** One nft command with the nft tool's output; code 0 on success, as the tool exits. */
export function nftCommand(command: string, netns?: string): { code: number; output: string; error: string } {
  return load().nftList(command, netnsPath(netns));
}
