//! The driver against the controller in one process, over a real vfio-user
//! socketpair.

use std::sync::Arc;

use vnvme::device::{DeviceOptions, NvmeDevice};
use vnvme::inproc::InProcess;
use vnvme::namespace::NamespaceSpec;
use vnvme_driver::{Controller, DeviceAccess, InitOptions};
use vnvme_spec::identify::ascii_field;

fn start(namespaces: &[&str], opts: InitOptions) -> (InProcess, Arc<dyn DeviceAccess>, Controller) {
    let specs: Vec<NamespaceSpec> = namespaces.iter().map(|s| s.parse().unwrap()).collect();
    let device = NvmeDevice::new(&DeviceOptions::default(), &specs).unwrap();
    let mut inproc = InProcess::start(device).unwrap();
    let access: Arc<dyn DeviceAccess> = Arc::new(inproc.access().unwrap());
    let ctrl = Controller::init(Arc::clone(&access), opts).unwrap();
    (inproc, access, ctrl)
}

#[test]
fn enable_and_identify_over_vfio_user() {
    let (_srv, _access, ctrl) = start(&["64M:ram", "16M:null"], InitOptions::default());
    let id = ctrl.identify();
    assert_eq!(ascii_field(&id.mn), "vnvme");
    assert_eq!(ascii_field(&id.sn), "VNVME0001");
    assert_eq!(id.nn.get(), 2);
    let ns = ctrl.namespaces();
    assert_eq!(ns.len(), 2);
    assert_eq!(ns[0].size_bytes(), 64 << 20);
    assert_eq!(ns[1].size_bytes(), 16 << 20);
}

#[test]
fn write_then_read_back_a_ram_namespace() {
    let (_srv, access, ctrl) = start(&["64M:ram"], InitOptions::default());
    let mut q = ctrl.take_io_queue(0).unwrap();
    let pattern: Vec<u8> = (0..16384u32).map(|i| (i * 7 + 3) as u8).collect();
    let wbuf = access.dma_alloc(pattern.len()).unwrap();
    wbuf.write_bytes(0, &pattern).unwrap();
    q.write(1, 100, 4, &wbuf).unwrap();
    let mut rbuf = access.dma_alloc(pattern.len()).unwrap();
    q.read(1, 100, 4, &mut rbuf).unwrap();
    assert_eq!(rbuf.to_vec(), pattern);
}
