//! Over the uTCP substrate, a graceful close does not cut off what the TCP still sends: the
//! messages queued before the CLOSE are delivered and reported `Sent`, not `Discarded`.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use squarepeg_connection::{Config, Connection, EndpointLink, Event, Role, Substrate, tcp_config};
use squarepeg_session::{MessageProps, MessageStatus};
use squarepeg_tcp::{ConnectionConfig, Event as TcpEvent};

#[test]
fn messages_queued_before_a_graceful_close_end_sent() {
    let start = Instant::now();
    let mut now = start;
    let window = ConnectionConfig::default().recv_buffer;
    let substrate = Substrate::utcp(window);
    let tcp = tcp_config(ConnectionConfig::default(), substrate, true);
    let (client_addr, server_addr): (SocketAddr, SocketAddr) = (
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:443".parse().unwrap(),
    );
    let mut client_ep = common::endpoint("10.0.0.1", 1, now);
    let mut server_ep = common::endpoint("10.0.0.2", 2, now);
    server_ep.listen(server_addr, 4, tcp.clone()).unwrap();
    let h = client_ep
        .connect(now, client_addr, server_addr, tcp)
        .unwrap();
    let mut client = (
        Connection::new(Role::Client, Config::default(), substrate).unwrap(),
        EndpointLink::new(h),
    );
    let mut server: Option<(Connection, EndpointLink)> = None;
    let mut statuses = BTreeMap::new();
    let mut received = Vec::new();
    let mut closed = false;
    let mut packet = vec![0u8; 2048];
    for _ in 0..20_000 {
        // Packets both ways, instantly.
        while let Some(n) = client_ep.poll_transmit(now, &mut packet) {
            let _ = server_ep.handle_packet(now, &packet[..n]);
        }
        while let Some(n) = server_ep.poll_transmit(now, &mut packet) {
            let _ = client_ep.handle_packet(now, &packet[..n]);
        }
        while let Some(ev) = server_ep.poll_event() {
            if let TcpEvent::Incoming(l) = ev
                && let Some(h) = server_ep.accept(l)
            {
                server = Some((
                    Connection::new(Role::Server, Config::default(), substrate).unwrap(),
                    EndpointLink::new(h),
                ));
            }
        }
        while client_ep.poll_event().is_some() {}
        if !closed
            && client_ep
                .connection(h)
                .is_some_and(|c| c.state() == squarepeg_tcp::State::Established)
        {
            // Three reliable messages, then the close, in one go.
            for i in 0..3u8 {
                let props = MessageProps::default();
                client
                    .0
                    .session_mut()
                    .send_message(now, vec![i; 100], props)
                    .unwrap();
            }
            client.0.session_mut().close(0, b"bye");
            closed = true;
        }
        client.1.drive(now, &mut client.0, &mut client_ep);
        if let Some((conn, link)) = server.as_mut() {
            link.drive(now, conn, &mut server_ep);
            while let Some(m) = conn.session_mut().poll_message() {
                received.push(m.number);
            }
            while conn.poll_event().is_some() {}
        }
        while let Some(ev) = client.0.poll_event() {
            if let Event::MessageStatus { numbers, status } = ev {
                for number in numbers {
                    assert!(
                        statuses.insert(number, status).is_none(),
                        "two statuses for {number}"
                    );
                }
            }
        }
        if client.0.is_drained() && statuses.len() == 3 {
            break;
        }
        now += Duration::from_millis(1);
        client_ep.handle_timeout(now);
        server_ep.handle_timeout(now);
        client.0.handle_timeout(now);
        if let Some((conn, _)) = server.as_mut() {
            conn.handle_timeout(now);
        }
    }
    assert!(closed, "the connection never opened");
    received.sort_unstable();
    assert_eq!(received, [0, 1, 2], "the server got every message");
    assert_eq!(
        statuses,
        (0..3).map(|n| (n, MessageStatus::Sent)).collect(),
        "delivered messages are reported Sent"
    );
}
