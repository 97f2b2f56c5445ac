//! Directive Send and Directive Receive (NVMe Base 2.0 §5.10, §5.9): the
//! Identify directive (what is supported and enabled, Enable Directive)
//! and the Streams directive (parameters, status, resources). The state
//! they change is in [`crate::streams`].

use vnvme_spec::directive::{
    dtype, receive_doper, send_doper, Cdw11Directive, Cdw12AllocateResources, Cdw12EnableDirective,
    StreamsParameters, IDENTIFY_ENABLED_OFFSET, IDENTIFY_PARAMETERS_SIZE,
};
use vnvme_spec::{Command, Status};
use zerocopy::little_endian::{U16, U32};
use zerocopy::IntoBytes;

use super::invalid_field;
use crate::command::Ctx;
use crate::namespace::NSID_ALL;
use crate::streams::MSL;

/// Directive types this controller supports, a bit per DTYPE.
const SUPPORTED: u8 = 1 << dtype::IDENTIFY | 1 << dtype::STREAMS;
/// Stream Write Size: the stream's optimal write is 4 KiB.
const SWS_BYTES: u32 = 4096;

/// Directive Send: no operation here takes data, so NUMD is not read
/// (libnvme sends a buffer with Enable Directive all the same).
pub(super) fn send(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let cdw11 = Cdw11Directive::from(cmd.cdw11);
    let nsid = cmd.nsid.get();
    let shared = ctx.shared;
    match (cdw11.dtype(), cdw11.doper()) {
        (dtype::IDENTIFY, send_doper::ENABLE_DIRECTIVE) => {
            let cdw12 = Cdw12EnableDirective::from(cmd.cdw12);
            // The Identify directive is always enabled: only Streams toggles.
            if cdw12.tdtype() != dtype::STREAMS {
                return Err(invalid_field());
            }
            let nsids = if nsid == NSID_ALL {
                let active = shared.subsystem.namespaces.active_list();
                active.iter().map(|ns| ns.nsid).collect()
            } else {
                vec![shared.namespace(nsid)?.nsid]
            };
            let mut streams = shared.features.streams.lock();
            for nsid in nsids {
                streams.set_enabled(nsid, cdw12.endir());
            }
            Ok(0)
        }
        (dtype::STREAMS, send_doper::RELEASE_IDENTIFIER) => {
            let nsid = shared.namespace(nsid)?.nsid;
            let released = shared
                .features
                .streams
                .lock()
                .release_identifier(nsid, cdw11.dspec());
            released.map(|()| 0)
        }
        (dtype::STREAMS, send_doper::RELEASE_RESOURCES) => {
            let nsid = shared.namespace(nsid)?.nsid;
            shared
                .features
                .streams
                .lock()
                .release_resources(nsid)
                .map(|()| 0)
        }
        _ => Err(invalid_field()),
    }
}

/// Directive Receive: the data (at most NUMD + 1 dwords of it) goes to the
/// host; Allocate Resources answers in dword 0 instead.
pub(super) fn receive(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let cdw11 = Cdw11Directive::from(cmd.cdw11);
    let ns = ctx.shared.namespace(cmd.nsid.get())?;
    let (data, dw0) = {
        let mut streams = ctx.shared.features.streams.lock();
        match (cdw11.dtype(), cdw11.doper()) {
            (dtype::IDENTIFY, receive_doper::RETURN_PARAMETERS) => {
                let mut data = vec![0; IDENTIFY_PARAMETERS_SIZE];
                data[0] = SUPPORTED;
                data[IDENTIFY_ENABLED_OFFSET] =
                    1 << dtype::IDENTIFY | u8::from(streams.enabled(ns.nsid)) << dtype::STREAMS;
                (data, 0)
            }
            (dtype::STREAMS, _) if !streams.enabled(ns.nsid) => return Err(invalid_field()),
            (dtype::STREAMS, receive_doper::RETURN_PARAMETERS) => {
                let this = streams.namespace(ns.nsid);
                let params = StreamsParameters {
                    msl: U16::new(MSL),
                    nssa: U16::new(streams.available()),
                    nsso: U16::new(streams.open_count()),
                    sws: U32::new((SWS_BYTES >> ns.lba_shift).max(1)),
                    sgs: U16::new(1),
                    nsa: U16::new(this.allocated),
                    nso: U16::new(this.open.len() as u16),
                    ..Default::default()
                };
                (params.as_bytes().to_vec(), 0)
            }
            (dtype::STREAMS, receive_doper::GET_STATUS) => {
                // Open Stream Count, then the open stream ids.
                let open = streams.namespace(ns.nsid).open;
                let mut data = (open.len() as u16).to_le_bytes().to_vec();
                data.extend(open.iter().flat_map(|sid| sid.to_le_bytes()));
                (data, 0)
            }
            (dtype::STREAMS, receive_doper::ALLOCATE_RESOURCES) => {
                let nsr = Cdw12AllocateResources::from(cmd.cdw12).nsr();
                (Vec::new(), u32::from(streams.allocate(ns.nsid, nsr)?))
            }
            _ => return Err(invalid_field()),
        }
    };
    if !data.is_empty() {
        // NUMD is 0's based: at least one dword, never more than we have.
        let numd_bytes = (u64::from(cmd.cdw10.get()) + 1) * 4;
        let len = data
            .len()
            .min(usize::try_from(numd_bytes).unwrap_or(usize::MAX));
        ctx.send(cmd, &data[..len])?;
    }
    Ok(dw0)
}
